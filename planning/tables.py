"""What `moa-pd plan` prints, as rich tables. Memory placement (planning.placement): worker ->
GPU(s), weights, pool, start turn, and per-GPU totals. The MILP's plan (a DeploymentPlan): its
workers, and its comparison with the naive and greedy baselines."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from planning.types import Placement

if TYPE_CHECKING:  # not imported at run time: planning.ilp_plan imports the MILP
    from planning.ilp_plan import Scored
    from planning.plan_file import DeploymentPlan


def placement_tables(plan: Placement) -> list[Table]:
    workers = Table(
        title=f"placement (policy {plan.policy}, concurrency {plan.concurrency})",
        title_justify="left",
    )
    for col in ("worker", "GPU(s)", "tp", "weights MiB", "pool tokens", "need", "pool MiB"):
        # Worker names are what a reader looks up: never cut them (numbers' headers wrap instead).
        workers.add_column(
            col, justify="left" if col == "worker" else "right", no_wrap=col == "worker"
        )
    workers.add_column("turn", justify="right")
    workers.add_column("mem fraction", justify="right")
    for w in sorted(plan.workers, key=lambda w: (w.turn, w.gpus, w.name)):
        workers.add_row(
            w.name,
            ",".join(map(str, w.gpus)),
            str(w.demand.tp),
            f"{w.weights_mib:,.0f}",
            f"{w.pool_tokens:,}",
            f"{w.demand.pool_tokens:,}",
            f"{w.pool_mib:,.0f}",
            str(w.turn),
            "-" if w.mem_fraction_static is None else f"{w.mem_fraction_static:.3f}",
        )
    gpus = Table(
        title=f"GPUs (planned use includes {plan.headroom_mib:,} MiB headroom per worker)",
        title_justify="left",
    )
    for col in ("GPU", "name", "workers", "planned MiB", "free MiB", "total MiB"):
        gpus.add_column(col, justify="left" if col == "name" else "right")
    for g in plan.gpus:
        on = [w.name for w in plan.workers if g.index in w.gpus]
        gpus.add_row(
            str(g.index),
            g.name,
            str(len(on)),
            f"{plan.used_mib(g.index):,.0f}",
            f"{g.free_mib:,}",
            f"{g.total_mib:,}",
        )
    return [workers, gpus]


def worker_table(plan: DeploymentPlan) -> Table:
    solver = plan.solver
    title = f"plan (mode {plan.mode}, concurrency {plan.predicted.concurrency})"
    if solver:
        title += f": {solver.get('name')} {solver.get('status')} in {solver.get('seconds')} s"
    table = Table(title=title, title_justify="left")
    for col in ("worker", "node", "GPU(s)/cores", "tp", "pool tokens", "share", "turn"):
        table.add_column(col, justify="left" if col == "worker" else "right", no_wrap=True)
    table.add_column("mem fraction", justify="right")
    for w in sorted(plan.workers, key=lambda w: (w.node, w.turn, w.gpus or w.cpus, w.name)):
        table.add_row(
            w.name,
            w.node,
            ",".join(map(str, w.gpus or w.cpus)),
            str(w.tp),
            f"{w.pool_tokens:,}",
            f"{w.share:.3f}",
            str(w.turn),
            "" if w.mem_fraction_static is None else f"{w.mem_fraction_static:.3f}",
        )
    return table


def comparison_table(scored: list[Scored]) -> Table:
    first = next((s.plan for s in scored if s.plan), None)
    by = first.solver.get("predictor", "") if first else ""
    table = Table(title=f"predicted ({by}) vs the baselines", title_justify="left")
    for col in ("plan", "workers", "median s", "p90 s", "questions/s", "ILP objective s"):
        table.add_column(col, justify="left" if col == "plan" else "right", no_wrap=True)
    table.add_column("note")
    for s in scored:
        if s.plan is None or s.prediction is None:
            table.add_row(s.name, "", "", "", "", "", s.error)
            continue
        p = s.prediction
        table.add_row(
            s.name,
            str(len(s.plan.workers)),
            f"{p.latency_median_s:.2f}",
            f"{p.latency_p90_s:.2f}",
            f"{p.throughput_qps:.3f}",
            f"{s.objective_s:.2f}",
            "",
        )
    return table
