"""Placement and replication as a MILP (MOSAIC's planner, on scipy's HiGHS): which device groups
each (model, role) has a replica on, and what share of its requests each replica takes, minimizing
the busiest device's load in a round (planning.cost_model) under every device's memory.

Variables, per (model, role) k and candidate group g (one device, or an aligned block of tp GPUs
within a node for a tensor-parallel model): x[k,g] in {0,1} (a replica there; a second replica
of k on the same group would only add its fixed cost), f[k,g] in [0,1] (its share), p[k,g] >= 0
(its KV pool tokens); and T, the bottleneck. f <= x links shares to replicas, f >= MIN_SHARE x
keeps every replica useful, p >= need f and p >= floor x size pools. Mode `fixed` keeps exactly
one replica per (model, role): only placement is chosen.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from planning.cost_model import Replica, RoleWork, tp_speedup
from planning.devices import Cluster
from planning.pack import HEADROOM_MIB, PlanError, choose_tp
from planning.types import MIB, Mode, WorkerDemand

MIN_SHARE = 0.01
TIME_LIMIT_S = 60.0
WORKER_COST = 0.002
# Plans within 0.1% of the best are as good as the cost model can tell apart (and HiGHS proves
# that much in seconds, where proving the last tie-break takes minutes on 16 GPUs).
MIP_GAP = 1e-3


@dataclass(frozen=True, slots=True)
class PlacedReplica:
    replica: Replica
    pool_tokens: int


@dataclass(frozen=True, slots=True)
class Solution:
    replicas: list[PlacedReplica]
    objective_s: float  # T: the busiest device's seconds in a round
    seconds: float  # solve time
    status: str
    variables: int
    constraints: int


def model_tps(
    w: RoleWork, cluster: Cluster, mode: Mode, headroom_mib: int, tp: int = 0
) -> list[int]:
    """The tp sizes a replica may take: the config's tp_size, else the fewest GPUs (a power of
    two) that hold one replica with the whole pool (as one replica per role needs), and in
    `replicate` mode also the fewest that hold it with the least pool (replicas share the pool)."""
    if cluster.kind == "cpu":
        return [1]
    if tp:
        return [tp]

    def fewest(pool: int) -> int:
        d = WorkerDemand(w.model, w.role, 0, 1, w.weights_bytes, w.kv_bytes_per_token, pool)
        return choose_tp(d, cluster.gpus(), headroom_mib)

    least = fewest(w.pool_floor)
    try:
        whole = fewest(w.pool_need)
    except PlanError:
        if mode == "fixed":
            raise
        return [least]
    return sorted({whole} if mode == "fixed" else {least, whole})


def groups(cluster: Cluster, tp: int) -> list[tuple[tuple[str, int], ...]]:
    """Aligned blocks of tp devices within each node (TP never spans nodes)."""
    if tp > cluster.per_node:
        raise PlanError(f"a model needs tp {tp}, but a node has only {cluster.per_node} GPU(s)")
    return [
        tuple((n, i) for i in range(b * tp, (b + 1) * tp))
        for n in cluster.nodes
        for b in range(cluster.per_node // tp)
    ]


def _replica_mib(w: RoleWork, tp: int, pool: int, headroom_mib: int) -> float:
    return (w.weights_bytes + pool * w.kv_bytes_per_token) / tp / MIB + headroom_mib


def _check_alone(w: RoleWork, tp: int, cluster: Cluster, mode: Mode, headroom_mib: int) -> None:
    pool = w.pool_need if mode == "fixed" else w.pool_floor
    need = _replica_mib(w, tp, pool, headroom_mib)
    if need > cluster.memory_mib:
        where = "a node's RAM" if cluster.kind == "cpu" else f"a GPU (tp {tp})"
        raise PlanError(
            f"{w.model} {w.role} does not fit: one replica needs {need:,.0f} MiB (weights "
            f"{w.weights_bytes / tp / MIB:,.0f} + KV pool {pool:,} tokens + headroom "
            f"{headroom_mib:,}) but {where} holds {cluster.memory_mib:,} MiB. Give bigger "
            "devices, more GPUs per node, a lower --concurrency or shorter outputs"
        )


def solve(
    work: dict[tuple[str, str], RoleWork],
    cluster: Cluster,
    mode: Mode = "replicate",
    headroom_mib: int = HEADROOM_MIB,
    tp_sizes: dict[str, int] | None = None,
    time_limit_s: float = TIME_LIMIT_S,
) -> Solution:
    """The plan of least bottleneck load, or PlanError naming what does not fit."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    keys = sorted(work)
    tp_sizes = tp_sizes or {}
    tps = {k: model_tps(work[k], cluster, mode, headroom_mib, tp_sizes.get(k[0], 0)) for k in keys}
    for k in keys:
        _check_alone(work[k], tps[k][-1], cluster, mode, headroom_mib)
    cand = [(k, g) for k in keys for tp in tps[k] for g in groups(cluster, tp)]
    n = len(cand)
    x, f, p, t = 0, n, 2 * n, 3 * n  # offsets of each variable block; T is the last variable
    nvar = 3 * n + 1
    rows: list[np.ndarray] = []
    lo: list[float] = []
    hi: list[float] = []

    def add(coef: dict[int, float], low: float, high: float) -> None:
        row = np.zeros(nvar)
        for i, v in coef.items():
            row[i] += v
        rows.append(row)
        lo.append(low)
        hi.append(high)

    for k in keys:
        mine = [j for j, (kk, _) in enumerate(cand) if kk == k]
        add({f + j: 1.0 for j in mine}, 1.0, 1.0)
        add({x + j: 1.0 for j in mine}, 1.0, 1.0 if mode == "fixed" else np.inf)
    for j, (k, _) in enumerate(cand):
        w = work[k]
        add({f + j: 1.0, x + j: -1.0}, -np.inf, 0.0)
        add({f + j: 1.0, x + j: -MIN_SHARE}, 0.0, np.inf)
        add({p + j: 1.0, f + j: -float(w.pool_need)}, 0.0, np.inf)
        add({p + j: 1.0, x + j: -float(w.pool_floor)}, 0.0, np.inf)
    for dom, cap in cluster.memory_domains().items():
        coef: dict[int, float] = {}
        for j, (k, g) in enumerate(cand):
            if any(cluster.domain_of(d) == dom for d in g):
                w, tp = work[k], len(g)
                coef[x + j] = (w.weights_bytes / tp) / MIB + headroom_mib
                coef[p + j] = w.kv_bytes_per_token / tp / MIB
        add(coef, -np.inf, float(cap) - 1.0)  # 1 MiB for rounding pools up to whole tokens
    for dev in cluster.devices:
        coef = {t: -1.0}
        for j, (k, g) in enumerate(cand):
            if dev in g:
                w, speed = work[k], tp_speedup(len(g))
                coef[x + j] = w.fixed_s / speed
                coef[f + j] = w.shared_s / speed
        add(coef, -np.inf, 0.0)
    # A worker costs memory and a process: one that buys less than WORKER_COST of a lower bound
    # of T (the heaviest single replica, or all work spread evenly) is not worth it.
    bound = max(
        max(w.fixed_s + w.shared_s / len(cluster.devices) for w in work.values()),
        sum(w.fixed_s + w.shared_s for w in work.values()) / len(cluster.devices),
    )
    cost = np.zeros(nvar)
    cost[t] = 1.0
    cost[x : x + n] = WORKER_COST * (bound or 1.0)
    integrality = np.zeros(nvar)
    integrality[x : x + n] = 1
    upper = np.concatenate([np.ones(2 * n), np.full(n + 1, np.inf)])
    lower = np.zeros(nvar)
    # Some replica of each (model, role) pays its whole fixed cost: a bound the LP relaxation
    # (which spreads x thinly) misses, and without which HiGHS takes minutes on 16 GPUs.
    lower[t] = max(work[k].fixed_s / tp_speedup(max(tps[k])) for k in keys)
    start = time.perf_counter()
    res = milp(
        cost,
        integrality=integrality,
        bounds=Bounds(lower, upper),
        constraints=LinearConstraint(np.array(rows), np.array(lo), np.array(hi)),
        options={"time_limit": time_limit_s, "mip_rel_gap": MIP_GAP},
    )
    seconds = time.perf_counter() - start
    if res.x is None:
        raise PlanError(_infeasible(work, tps, cluster, mode, headroom_mib, res.message))
    placed = []
    for k in keys:
        chosen = [j for j, (kk, _) in enumerate(cand) if kk == k and res.x[x + j] > 0.5]
        total = sum(res.x[f + j] for j in chosen)
        for j in chosen:
            w, share = work[k], res.x[f + j] / total
            pool = max(w.pool_floor, math.ceil(w.pool_need * share))
            placed.append(PlacedReplica(Replica(k[0], k[1], cand[j][1], share), pool))
    status = "optimal" if res.status == 0 else f"stopped: {res.message}"
    return Solution(placed, float(res.x[t]), seconds, status, nvar, len(rows))


def _infeasible(
    work: dict[tuple[str, str], RoleWork],
    tps: dict[tuple[str, str], list[int]],
    cluster: Cluster,
    mode: Mode,
    headroom_mib: int,
    message: str,
) -> str:
    """Why no plan fits: every (model, role) needs one replica at least, and its whole KV pool
    (replicas split it); name the sum and the largest needs against the memory there is."""
    need = {
        f"{k[0]} {k[1]}": _replica_mib(work[k], 1, work[k].pool_need, 0) + headroom_mib * tps[k][-1]
        for k in work
    }
    total = sum(cluster.memory_domains().values())
    largest = ", ".join(
        f"{name} {mib:,.0f} MiB" for name, mib in sorted(need.items(), key=lambda kv: -kv[1])[:3]
    )
    return (
        f"no placement fits ({message.strip()}): one replica per model and role with its KV "
        f"pool needs {sum(need.values()):,.0f} MiB in all (largest: {largest}), the "
        f"{len(cluster.devices)} {cluster.kind.upper()}(s) hold {total:,} MiB, and no worker can "
        "be split across devices but by TP. Give more or bigger devices, a lower --concurrency, "
        "or shorter outputs"
    )
