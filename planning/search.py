"""The planner's local search: a placement (the MILP's proposal, or a baseline that scores
better) refined one replica at a time, each candidate scored by the simulator, within a time
budget. The MILP minimizes the busiest device's load in a round (planning.cost_model), which
leaves out what users get: a question's critical path, the gate's warm-ups, queueing. The
simulator scores that, so it decides; the cost model only orders the moves, most promising
first: relieve the busiest device by adding a replica of one of its workers elsewhere, moving one
of its workers, or removing a replica where a model has several (a move to a group of another
size changes the worker's TP). First improvement is taken, then the moves are ordered again.

Hand-written: a generic optimizer (simulated annealing, Optuna) would spend the same
simulations without the cost model's order, and the budget buys only tens of them."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from planning.baselines import check_memory
from planning.cost_model import Replica, RoleWork, device_loads
from planning.devices import Cluster
from planning.ilp import PlacedReplica, groups
from planning.pack import PlanError
from planning.plan_file import Prediction
from planning.types import Mode

Key = tuple[str, str]  # (model, role)
Group = tuple[tuple[str, int], ...]
# A candidate must beat the best by this much to be taken: the simulator is deterministic, but
# a gain smaller than this is within its error against a measured run, and chasing it spends
# the budget.
MIN_GAIN = 0.005
# Per busiest worker: this many of the least loaded groups are tried for each move.
GROUPS_PER_MOVE = 2


@dataclass(frozen=True, slots=True)
class Move:
    what: str  # e.g. "add qwen3-32b decode on node0:2", for the search's log
    placed: list[PlacedReplica]


@dataclass
class SearchResult:
    placed: list[PlacedReplica]
    prediction: Prediction  # as the search scored it (its question count)
    evaluations: int = 0
    accepted: list[str] = field(default_factory=list)  # the moves taken, in order
    seconds: float = 0.0
    converged: bool = False  # no move improved the last plan (else the budget ran out)


def score_key(p: Prediction) -> tuple[float, float]:
    """Higher is better: throughput at the plan's concurrency (closed loop: Q ÷ mean latency, so
    the same as the lowest mean latency), then the lower p90."""
    return (p.throughput_qps, -p.latency_p90_s)


def rebalance(
    placed: list[PlacedReplica], key: Key, work: dict[Key, RoleWork]
) -> list[PlacedReplica]:
    """`placed` with `key`'s replicas sharing its requests equally (the shell router's choice
    balances them by load anyway), each pool sized for its share."""
    mine = [p for p in placed if (p.replica.model, p.replica.role) == key]
    w, share = work[key], 1.0 / len(mine)
    pool = max(w.pool_floor, math.ceil(w.pool_need * share))
    out = []
    for p in placed:
        if (p.replica.model, p.replica.role) == key:
            r = p.replica
            p = PlacedReplica(Replica(r.model, r.role, r.devices, share), pool)
        out.append(p)
    return out


def _name(g: Group) -> str:
    return f"{g[0][0]}:{','.join(str(i) for _, i in g)}"


def moves(
    placed: list[PlacedReplica],
    work: dict[Key, RoleWork],
    cluster: Cluster,
    tps: dict[Key, list[int]],
    mode: Mode,
) -> Iterator[Move]:
    """Neighbours of `placed`, most promising first by the cost model's device loads."""
    loads = device_loads([p.replica for p in placed], work)

    def group_load(g: Group) -> float:
        return max(loads.get(d, 0.0) for d in g)

    def replica_load(p: PlacedReplica) -> float:
        return work[(p.replica.model, p.replica.role)].seconds(
            p.replica.share, len(p.replica.devices)
        )

    seen: set[tuple] = set()
    for device in sorted(cluster.devices, key=lambda d: -loads.get(d, 0.0)):
        here = sorted(
            (p for p in placed if device in p.replica.devices), key=replica_load, reverse=True
        )
        for p in here:
            r = p.replica
            key = (r.model, r.role)
            hosting = {
                q.replica.devices for q in placed if (q.replica.model, q.replica.role) == key
            }
            free = sorted(
                (g for tp in tps[key] for g in groups(cluster, tp) if g not in hosting),
                key=group_load,
            )[:GROUPS_PER_MOVE]
            others = [q for q in placed if q is not p]
            count = len(hosting)
            options: list[tuple[str, list[PlacedReplica], Key]] = []
            if mode == "replicate":
                for g in free:
                    new = PlacedReplica(Replica(r.model, r.role, g, r.share), p.pool_tokens)
                    options.append((f"add {r.model} {r.role} on {_name(g)}", [*placed, new], key))
            for g in free:
                moved = PlacedReplica(Replica(r.model, r.role, g, r.share), p.pool_tokens)
                options.append(
                    (
                        f"move {r.model} {r.role} {_name(r.devices)} -> {_name(g)}",
                        [*others, moved],
                        key,
                    )
                )
            if mode == "replicate" and count > 1:
                options.append((f"remove {r.model} {r.role} on {_name(r.devices)}", others, key))
            for what, cand, k in options:
                if what in seen:
                    continue
                seen.add(what)
                yield Move(what, rebalance(cand, k, work))


def refine(
    start: list[PlacedReplica],
    start_prediction: Prediction,
    score: Callable[[list[PlacedReplica]], Prediction],
    work: dict[Key, RoleWork],
    cluster: Cluster,
    tps: dict[Key, list[int]],
    mode: Mode,
    headroom_mib: int,
    budget_s: float,
) -> SearchResult:
    """First-improvement local search from `start` until no move improves it or `budget_s`
    (wall seconds, checked before each simulation) is spent."""
    began = time.perf_counter()
    result = SearchResult(list(start), start_prediction)
    while True:
        improved = False
        for move in moves(result.placed, work, cluster, tps, mode):
            if time.perf_counter() - began >= budget_s:
                result.seconds = time.perf_counter() - began
                return result
            try:
                check_memory(move.what, move.placed, work, cluster, headroom_mib)
            except PlanError:
                continue
            prediction = score(move.placed)
            result.evaluations += 1
            if prediction.throughput_qps > (1 + MIN_GAIN) * result.prediction.throughput_qps:
                result.placed, result.prediction = move.placed, prediction
                result.accepted.append(move.what)
                improved = True
                break
        if not improved:
            result.converged = True
            result.seconds = time.perf_counter() - began
            return result
