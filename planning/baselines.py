"""The plans a plan is compared with: `naive` (one replica per role, workers dealt round-robin
over the devices), `greedy` (today's deployment: the configs' replicas packed first-fit
decreasing by planning.pack on GPUs, or pinned by planning.pack.plan_cpus on CPU) and `paper`
(the paper's launcher: one replica per role, each worker on GPUs of its own, as many as that
takes, whatever the cluster has)."""

from __future__ import annotations

import dataclasses

from planning.cost_model import Replica, RoleWork
from planning.devices import Cluster
from planning.ilp import PlacedReplica, model_tps
from planning.pack import PlanError, place, plan_cpus
from planning.types import GPU, MIB, WorkerDemand
from router.config import ModelSpec

ROLE_ORDER = ("prefill", "decode")


def check_memory(
    name: str, placed: list[PlacedReplica], work: dict, cluster: Cluster, headroom_mib: int
) -> None:
    used: dict = {}
    for p in placed:
        w, tp = work[(p.replica.model, p.replica.role)], len(p.replica.devices)
        mib = (w.weights_bytes + p.pool_tokens * w.kv_bytes_per_token) / tp / MIB + headroom_mib
        for d in p.replica.devices:
            dom = cluster.domain_of(d)
            used[dom] = used.get(dom, 0.0) + mib
    for dom, mib in used.items():
        if mib > cluster.memory_mib:
            where = f"{dom[0]} RAM" if dom[1] is None else f"{dom[0]} GPU {dom[1]}"
            raise PlanError(
                f"the {name} placement does not fit: {where} would hold {mib:,.0f} MiB of "
                f"{cluster.memory_mib:,} MiB"
            )


def naive(
    work: dict[tuple[str, str], RoleWork],
    cluster: Cluster,
    headroom_mib: int,
    tp_sizes: dict[str, int] | None = None,
) -> list[PlacedReplica]:
    """One replica per (model, role), in the configs' model order, each on the next device(s)."""
    devices, per = cluster.devices, cluster.per_node
    models = list(dict.fromkeys(m for m, _ in work))
    placed, cursor = [], 0
    for m in models:
        for role in ROLE_ORDER:
            w = work[(m, role)]
            tp = model_tps(w, cluster, "fixed", headroom_mib, (tp_sizes or {}).get(m, 0))[-1]
            if tp > 1:  # a TP worker takes the next aligned block of its node's GPUs
                cursor = -(-cursor // tp) * tp % len(devices)
            node_start = cursor // per * per
            group = tuple(devices[node_start + (cursor - node_start + i) % per] for i in range(tp))
            placed.append(PlacedReplica(Replica(m, role, group, 1.0), w.pool_need))
            cursor = (cursor + tp) % len(devices)
    check_memory("naive", placed, work, cluster, headroom_mib)
    return placed


def paper(
    work: dict[tuple[str, str], RoleWork],
    cluster: Cluster,
    headroom_mib: int,
    tp_sizes: dict[str, int] | None = None,
) -> tuple[list[PlacedReplica], Cluster]:
    """Every worker alone on its GPU(s), one replica per role: the placement and the one node of
    as many GPUs (of the cluster's kind) as it takes."""
    if cluster.kind != "gpu":
        raise PlanError("the paper's layout gives each worker its own GPU: a GPU plan only")
    tps = [
        model_tps(w, cluster, "fixed", headroom_mib, (tp_sizes or {}).get(m, 0))[-1]
        for (m, _), w in work.items()
    ]
    # Aligned TP blocks, largest first, leave no gaps: as many GPUs as the workers' ranks.
    own = dataclasses.replace(cluster, nodes=[cluster.nodes[0]], per_node=sum(tps))
    order = sorted(zip(work, tps, strict=True), key=lambda kt: -kt[1])
    placed, cursor = [], 0
    for (m, role), tp in order:
        group = tuple((own.nodes[0], cursor + i) for i in range(tp))
        placed.append(PlacedReplica(Replica(m, role, group, 1.0), work[(m, role)].pool_need))
        cursor += tp
    check_memory("paper", placed, work, own, headroom_mib)
    return placed, own


def greedy(
    work: dict[tuple[str, str], RoleWork],
    specs: dict[str, ModelSpec],
    cluster: Cluster,
    headroom_mib: int,
    concurrency: int,
) -> list[PlacedReplica]:
    """The configs' own replicas (workers.prefill/decode), each with the whole pool, packed as
    `moa-pd up` packs them today (all nodes' GPUs as one list; a TP worker within a node)."""
    demands = []
    for (m, role), w in work.items():
        replicas = getattr(specs[m].workers, role)
        tp_size = int(specs[m].server_args.get("sglang", {}).get("tp_size", 0))
        tp = model_tps(w, cluster, "fixed", headroom_mib, tp_size)[-1]
        for i in range(replicas):
            demands.append(
                WorkerDemand(m, role, i, tp, w.weights_bytes, w.kv_bytes_per_token, w.pool_need)
            )
    devices = cluster.devices
    if cluster.kind == "cpu":
        node = cluster.nodes[0]
        cores = plan_cpus([d.role for d in demands], list(range(cluster.per_node)))
        placed = [
            PlacedReplica(
                Replica(
                    d.model, d.role, ((node, c[0]),), 1 / getattr(specs[d.model].workers, d.role)
                ),
                d.pool_tokens,
            )
            for d, c in zip(demands, cores, strict=True)
        ]
        check_memory("greedy", placed, work, cluster, headroom_mib)
        return placed
    gpus = [
        GPU(k, cluster.name, cluster.memory_mib, cluster.memory_mib) for k in range(len(devices))
    ]
    placement = place(demands, gpus, "pack", concurrency, headroom_mib)
    placed = []
    for wp in placement.workers:
        group = tuple(devices[i] for i in wp.gpus)
        if len({n for n, _ in group}) > 1:
            raise PlanError(f"the greedy placement puts {wp.name} across nodes: {group}")
        share = 1 / getattr(specs[wp.demand.model].workers, wp.demand.role)
        placed.append(
            PlacedReplica(Replica(wp.demand.model, wp.demand.role, group, share), wp.pool_tokens)
        )
    return placed
