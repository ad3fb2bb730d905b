"""A DeploymentPlan as rich tables (as planning.table shows a placement): its workers, and the
comparison of the MILP's plan with the naive and greedy baselines."""

from __future__ import annotations

from rich.table import Table

from planning.plan_file import DeploymentPlan
from planning.planner import Scored


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
