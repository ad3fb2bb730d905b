"""The planner's local search: a placement (the MILP's proposal, or a baseline that scores
better) refined one replica at a time, each candidate scored by the simulator, within a time
budget. The MILP minimizes the busiest device's load in a round (planning.cost_model), which
leaves out what users get: a question's critical path, the gate's warm-ups, queueing. The
simulator scores that, so it decides; the cost model only orders the moves, most promising
first: relieve the busiest device by adding a replica of one of its workers elsewhere, moving one
of its workers, or removing a replica where a model has several (a move to a group of another
size changes the worker's TP). The first move that improves is taken, or a removal that costs
nothing (within MIN_GAIN of the best: fewer workers, and a way off a plateau); then the moves
are ordered again. The best plan seen is the answer.

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
# A candidate must beat the current plan by this much to be taken (a removal: come within it of
# the best): the simulator is deterministic, but a gain smaller than this is within its error
# against a measured run, and chasing it spends the budget.
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
    converged: bool = False  # no move was taken from the last plan (else the budget ran out)


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


def signature(placed: list[PlacedReplica]) -> frozenset:
    """What tells two placements apart: each replica's model, role and devices."""
    return frozenset((p.replica.model, p.replica.role, p.replica.devices) for p in placed)


def moves(
    placed: list[PlacedReplica],
    work: dict[Key, RoleWork],
    cluster: Cluster,
    tps: dict[Key, list[int]],
    mode: Mode,
    headroom_mib: int,
) -> Iterator[Move]:
    """Neighbours of `placed` that fit in memory, most promising first by the cost model's
    device loads: per worker on the busiest devices first, a replica more (replicate mode) or the
    worker moved, on the least loaded groups where it fits, and, once per model and role with
    several replicas, the replica on the busiest device removed."""
    loads = device_loads([p.replica for p in placed], work)

    def group_load(g: Group) -> float:
        return max(loads.get(d, 0.0) for d in g)

    def replica_load(p: PlacedReplica) -> float:
        return work[(p.replica.model, p.replica.role)].seconds(
            p.replica.share, len(p.replica.devices)
        )

    def fits(cand: list[PlacedReplica]) -> bool:
        try:
            check_memory("candidate", cand, work, cluster, headroom_mib)
        except PlanError:
            return False
        return True

    removed: set[Key] = set()
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
            targets = sorted(
                (g for tp in tps[key] for g in groups(cluster, tp) if g not in hosting),
                key=group_load,
            )
            others = [q for q in placed if q is not p]
            if mode == "replicate" and len(hosting) > 1 and key not in removed:
                removed.add(key)
                yield Move(
                    f"remove {r.model} {r.role} on {_name(r.devices)}", rebalance(others, key, work)
                )
            kinds = ("add", "move") if mode == "replicate" else ("move",)
            for kind in kinds:
                found = 0
                for g in targets:
                    if found == GROUPS_PER_MOVE:
                        break
                    new = PlacedReplica(Replica(r.model, r.role, g, r.share), p.pool_tokens)
                    cand = rebalance([*placed, new] if kind == "add" else [*others, new], key, work)
                    if fits(cand):
                        found += 1
                        what = (
                            f"add {r.model} {r.role} on {_name(g)}"
                            if kind == "add"
                            else (f"move {r.model} {r.role} {_name(r.devices)} -> {_name(g)}")
                        )
                        yield Move(what, cand)


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
    """Local search from `start` until no move is taken or `budget_s` (wall seconds, checked
    before each simulation) is spent; the best plan seen is the result. `score` raises PlanError
    for a plan that cannot be started (skipped). A move is taken when it
    scores better than the current plan by MIN_GAIN, or when it removes a replica and scores
    within MIN_GAIN of the best plan seen (fewer workers for as much: memory freed for the next
    moves, a way off a plateau); no plan is visited twice."""
    began = time.perf_counter()
    result = SearchResult(list(start), start_prediction)
    current, now = list(start), start_prediction
    visited = {signature(start)}
    while True:
        taken = False
        for move in moves(current, work, cluster, tps, mode, headroom_mib):
            if time.perf_counter() - began >= budget_s:
                result.seconds = time.perf_counter() - began
                return result
            seen = signature(move.placed)
            if seen in visited:
                continue
            visited.add(seen)
            try:
                prediction = score(move.placed)
            except PlanError:  # fits the devices' memory, but not as workers start in turns
                continue
            result.evaluations += 1
            better = prediction.throughput_qps > (1 + MIN_GAIN) * now.throughput_qps
            best = result.prediction.throughput_qps
            simpler = (
                move.what.startswith("remove")
                and prediction.throughput_qps >= (1 - MIN_GAIN) * best
            )
            if better or simpler:
                current, now = move.placed, prediction
                result.accepted.append(move.what)
                if prediction.throughput_qps > best or (
                    simpler and prediction.throughput_qps >= best
                ):
                    result.placed, result.prediction = move.placed, prediction
                taken = True
                break
        if not taken:
            result.converged = True
            result.seconds = time.perf_counter() - began
            return result
