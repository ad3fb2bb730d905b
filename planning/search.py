"""The planner's local search: a placement (the MILP's proposal, or a baseline that scores
better) refined one replica at a time, each candidate scored by the simulator, within a time
budget. The MILP minimizes the busiest device's load in a round (planning.cost_model), which
leaves out what users get: a question's critical path, the gate's warm-ups, queueing. The
simulator scores that, so it decides.

It also orders the moves. A neighbour adds a replica of a worker on a lightly loaded device, moves
a worker there, or removes a replica where a model has several (a move to a group of another size
changes the worker's TP). Removals come first (one that costs nothing is taken at once: fewer
workers, and a way off a plateau); the rest are ranked by the device loads they would leave, the
lowest peak first, from the last simulation's device utilization (split between a device's
workers by their cost-model seconds). The cost model's round ranks them only where no simulation
says how busy each device was: it misjudges what binds (issue 29: on 4 GPUs at Q = 32 it rated
the MILP's plan balanced where the simulator had one GPU 27% busy and three 73%, and the moves onto
the idle GPU came after the budget). Of the improving moves the best of the first WINDOW is taken,
then the moves are ranked again. The best plan seen is the answer.

Hand-written: a generic optimizer (simulated annealing, Optuna) would spend the same
simulations without this order, and the budget buys only tens of them."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from planning.baselines import check_memory
from planning.cost_model import Replica, RoleWork, device_loads
from planning.devices import Cluster, parse_device_key
from planning.ilp import PlacedReplica, groups
from planning.pack import PlanError
from planning.plan_file import Prediction
from planning.types import Mode

Key = tuple[str, str]  # (model, role)
Device = tuple[str, int]  # (node, index)
Group = tuple[tuple[str, int], ...]
# A candidate must beat the current plan by this much to be taken (a removal: come within it of
# the best): the simulator is deterministic, but a gain smaller than this is within its error
# against a measured run, and chasing it spends the budget.
MIN_GAIN = 0.005
# Per worker: this many of the least loaded groups are tried for each move.
GROUPS_PER_MOVE = 2
# Improving moves scored before the best of them is taken (refine).
WINDOW = 3


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


def simulated_loads(utilization: dict[str, float], cluster: Cluster) -> dict[Device, float]:
    """The simulator's device utilization (Prediction.device_utilization) per device of the
    cluster: a TP group's share is each of its GPUs'; unpinned cores ("node0:cpu") share the
    node's utilization."""
    loads: dict[Device, float] = {}
    for name, busy in utilization.items():
        node, _, ids = parse_device_key(name)
        devices = [(node, i) for i in ids] if ids else [d for d in cluster.devices if d[0] == node]
        for d in devices:
            loads[d] = loads.get(d, 0.0) + busy
    return loads


def moves(
    placed: list[PlacedReplica],
    work: dict[Key, RoleWork],
    cluster: Cluster,
    tps: dict[Key, list[int]],
    mode: Mode,
    headroom_mib: int,
    utilization: dict[str, float] | None = None,
) -> Iterator[Move]:
    """Neighbours of `placed` that fit in memory, most promising first: per worker (the busiest
    devices' first) a replica more (replicate mode) or the worker moved, on the least loaded
    groups where it fits, and, once per model and role with several replicas, the replica on the
    busiest device removed; the removals first, then the rest by the loads they would leave (see
    the module's docstring). Loads: the simulator's `utilization` of `placed` where given, else
    the cost model's round."""
    loads = (
        simulated_loads(utilization, cluster)
        if utilization
        else device_loads([p.replica for p in placed], work)
    )

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

    # Each replica's part of its devices' loads: a device's load split between the replicas on
    # it in proportion to their cost-model seconds (the simulator reports devices, not workers).
    on_device: dict[Device, float] = {}
    for q in placed:
        for d in q.replica.devices:
            on_device[d] = on_device.get(d, 0.0) + replica_load(q)

    def part(q: PlacedReplica) -> float:
        ds = q.replica.devices
        return sum(loads.get(d, 0.0) * replica_load(q) / (on_device[d] or 1.0) for d in ds) / len(
            ds
        )

    def after(shifts: list[tuple[Group, float]]) -> tuple[float, ...]:
        """The devices' loads, busiest first, with each group's load changed by its shift: how a
        candidate is ranked (the lowest peak first, then the next device's, ...)."""
        new = dict.fromkeys(cluster.devices, 0.0) | loads
        for g, delta in shifts:
            for d in g:
                new[d] = new.get(d, 0.0) + delta
        return tuple(sorted(new.values(), reverse=True))

    found_moves: list[tuple[tuple[float, ...], int, Move]] = []
    removed: set[Key] = set()
    for device in sorted(cluster.devices, key=lambda d: -loads.get(d, 0.0)):
        here = sorted(
            (p for p in placed if device in p.replica.devices), key=replica_load, reverse=True
        )
        for p in here:
            r = p.replica
            key = (r.model, r.role)
            mine = [q for q in placed if (q.replica.model, q.replica.role) == key]
            hosting = {q.replica.devices for q in mine}
            targets = sorted(
                (g for tp in tps[key] for g in groups(cluster, tp) if g not in hosting),
                key=group_load,
            )
            others = [q for q in placed if q is not p]
            n, total = len(mine), sum(part(q) for q in mine)
            if mode == "replicate" and n > 1 and key not in removed:
                removed.add(key)
                rank = after(
                    [(r.devices, -part(p))]
                    + [(q.replica.devices, part(p) / (n - 1)) for q in mine if q is not p]
                )
                what = f"remove {r.model} {r.role} on {_name(r.devices)}"
                found_moves.append(
                    (rank, len(found_moves), Move(what, rebalance(others, key, work)))
                )
            kinds = ("add", "move") if mode == "replicate" else ("move",)
            for kind in kinds:
                found = 0
                for g in targets:
                    if found == GROUPS_PER_MOVE:
                        break
                    new = PlacedReplica(Replica(r.model, r.role, g, r.share), p.pool_tokens)
                    cand = rebalance([*placed, new] if kind == "add" else [*others, new], key, work)
                    if not fits(cand):
                        continue
                    found += 1
                    if kind == "add":  # the model's load spread over one replica more
                        shifts = [(q.replica.devices, -part(q) / (n + 1)) for q in mine]
                        shifts.append((g, total / (n + 1)))
                        what = f"add {r.model} {r.role} on {_name(g)}"
                    else:
                        shifts = [(r.devices, -part(p)), (g, part(p))]
                        what = f"move {r.model} {r.role} {_name(r.devices)} -> {_name(g)}"
                    found_moves.append((after(shifts), len(found_moves), Move(what, cand)))
    # Removals first: one is taken at once when it costs nothing (refine), which frees a device
    # for the moves after it; the rest by the loads they would leave.
    for _, _, move in sorted(
        found_moves, key=lambda m: (not m[2].what.startswith("remove"), *m[:2])
    ):
        yield move


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
    for a plan that cannot be started (skipped). Of the moves that score better than the current
    plan by MIN_GAIN, the best of the first WINDOW is taken (the first alone is often a lesser
    gain that leads to a worse local optimum: on 4 GPUs at Q = 32, adding an 8B decode replica
    before moving the 8B prefill to the idle GPU); a move that removes a replica is taken at
    once when it scores within MIN_GAIN of the best plan seen (fewer workers for as much: memory
    freed for the next moves, a way off a plateau). No plan is visited twice."""
    began = time.perf_counter()
    result = SearchResult(list(start), start_prediction)
    current, now = list(start), start_prediction
    visited = {signature(start)}

    def take(move: Move, prediction: Prediction) -> None:
        nonlocal current, now
        current, now = move.placed, prediction
        result.accepted.append(move.what)

    while True:
        improving: list[tuple[Prediction, Move]] = []
        removed = False
        out_of_time = False
        for move in moves(current, work, cluster, tps, mode, headroom_mib, now.device_utilization):
            if time.perf_counter() - began >= budget_s:
                out_of_time = True
                break
            seen = signature(move.placed)
            if seen in visited:
                continue
            visited.add(seen)
            try:
                prediction = score(move.placed)
            except PlanError:  # fits the devices' memory, but not as workers start in turns
                continue
            result.evaluations += 1
            best = result.prediction.throughput_qps
            if prediction.throughput_qps > best:
                result.placed, result.prediction = move.placed, prediction
            if (
                move.what.startswith("remove")
                and prediction.throughput_qps >= (1 - MIN_GAIN) * best
            ):
                take(move, prediction)
                if prediction.throughput_qps >= best:  # as good with fewer workers
                    result.placed, result.prediction = move.placed, prediction
                removed = True
                break
            if prediction.throughput_qps > (1 + MIN_GAIN) * now.throughput_qps:
                improving.append((prediction, move))
                if len(improving) == WINDOW:
                    break
        if improving and not removed:
            prediction, move = max(improving, key=lambda pm: score_key(pm[0]))
            take(move, prediction)
        if out_of_time or not (improving or removed):
            result.converged = not out_of_time
            result.seconds = time.perf_counter() - began
            return result
