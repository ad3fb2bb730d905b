"""What `moa-pd plan` prints, as rich tables. Memory placement (planning.placement): worker ->
GPU(s), weights, pool, start turn, and per-GPU totals. The MILP's plan (a DeploymentPlan): its
workers, and its comparison with the baselines and the bounds (planning.ilp_plan)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from planning.types import Placement

if TYPE_CHECKING:  # not imported at run time: planning.ilp_plan imports the MILP
    from planning.ilp_plan import PlanReport
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
        title += (
            f": {solver.get('name')}, MILP {solver.get('status')}, planned in "
            f"{solver.get('seconds')} s"
        )
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


def comparison_table(report: PlanReport) -> Table:
    b = report.bounds
    table = Table(
        title=(
            f"predicted (simulation.predict) vs the baselines and the bounds: Little "
            f"{b.little_qps:.3f} q/s (one question alone {b.alone_s:.2f} s), capacity "
            f"{b.capacity_qps:.3f} q/s ({b.device_seconds_per_question:.2f} device-s a question "
            f"on {b.devices})"
        ),
        title_justify="left",
    )
    cols = ("plan", "setting", "workers", "devices", "median s", "p90 s", "questions/s")
    for col in (*cols, "÷ Little", "÷ capacity"):
        table.add_column(col, justify="left" if col == "plan" else "right", no_wrap=True)
    table.add_column("note")
    for s in report.scored:
        if s.plan is None or s.prediction is None:
            table.add_row(s.name, "", "", "", "", "", "", "", "", s.error)
            continue
        p = s.prediction
        table.add_row(
            s.name,
            f"#{s.setting}",
            str(len(s.plan.workers)),
            str(s.devices),
            f"{p.latency_median_s:.2f}",
            f"{p.latency_p90_s:.2f}",
            f"{p.throughput_qps:.3f}",
            f"{p.throughput_qps / b.little_qps:.2f}",
            f"{p.throughput_qps / b.capacity_qps:.2f}",
            _note(report, s.name),
        )
    return table


def _note(report: PlanReport, name: str) -> str:
    solver = report.plan.solver
    if name == "plan":
        search = report.search
        end = "converged" if search.converged else "budget spent"
        return (
            f"from {solver.get('chosen_from')}; search from {solver.get('search_from')}: "
            f"{search.evaluations} simulations, {len(search.accepted)} moves taken, {end}"
        )
    if name == "paper":
        return "each worker on GPUs of its own"
    if name == "naive_layer_barrier":
        return "naive placement, a barrier after each layer"
    return ""
