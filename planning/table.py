"""A placement as rich tables: worker -> GPU(s), weights, pool, start turn; per-GPU totals."""

from __future__ import annotations

from rich.table import Table

from planning.types import Placement


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
