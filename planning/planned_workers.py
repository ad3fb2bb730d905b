"""Placed replicas as plan.json's workers: numbered per (model, role), with each GPU worker's start
turn and --mem-fraction-static from planning.pack (per node), or its cores on a CPU plan."""

from __future__ import annotations

from planning.cost_model import RoleWork
from planning.devices import Cluster
from planning.ilp import PlacedReplica
from planning.pack import assign_turns
from planning.plan_file import PlannedWorker
from planning.types import WorkerDemand


def planned_workers(
    placed: list[PlacedReplica],
    work: dict[tuple[str, str], RoleWork],
    cluster: Cluster,
    headroom_mib: int,
    concurrency: int,
) -> list[PlannedWorker]:
    numbered: list[tuple[WorkerDemand, PlacedReplica]] = []
    count: dict[tuple[str, str], int] = {}
    for p in placed:
        r = p.replica
        i = count[(r.model, r.role)] = count.get((r.model, r.role), -1) + 1
        w = work[(r.model, r.role)]
        demand = WorkerDemand(
            r.model, r.role, i, len(r.devices), w.weights_bytes, w.kv_bytes_per_token, p.pool_tokens
        )
        numbered.append((demand, p))
    if cluster.kind == "cpu":  # cores share the node's RAM: no turns, no memory fraction
        return [_worker(d, p, [], [i for _, i in p.replica.devices], 0, None) for d, p in numbered]
    workers = []
    for node in cluster.nodes:
        mine = [(d, p) for d, p in numbered if p.replica.devices[0][0] == node]
        # Largest first, as planning.pack starts them: the roomiest start sees the most free.
        mine.sort(key=lambda dp: -dp[0].bytes_per_gpu(dp[1].pool_tokens, 0))
        turns = assign_turns(
            [(d, tuple(i for _, i in p.replica.devices), p.pool_tokens) for d, p in mine],
            cluster.gpus(),
            "pack",
            concurrency,
            headroom_mib,
        )
        for (d, p), wp in zip(mine, turns.workers, strict=True):
            workers.append(_worker(d, p, list(wp.gpus), [], wp.turn, wp.mem_fraction_static))
    return workers


def _worker(
    d: WorkerDemand,
    p: PlacedReplica,
    gpus: list[int],
    cpus: list[int],
    turn: int,
    fraction: float | None,
) -> PlannedWorker:
    return PlannedWorker(
        model=d.model,
        role=d.role,
        replica=d.replica,
        node=p.replica.devices[0][0],
        gpus=gpus,
        cpus=cpus,
        tp=d.tp,
        pool_tokens=p.pool_tokens,
        mem_fraction_static=fraction,
        turn=turn,
        share=p.replica.share,
    )
