"""The plan's data types, plain dataclasses: a GPU, a worker's demand, the placement of every
worker, and the policy that made it. Reused by later planners (an ILP over profiled costs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

MIB = 1 << 20

# pack: several workers share a GPU where they fit (first-fit decreasing by memory).
# one-per-worker: each worker (each TP rank) has its GPU(s) to itself, as before placement.
# plan: read from a plan.json (launch/plan_deploy.py), not computed here.
Policy = Literal["pack", "one-per-worker", "plan"]
POLICIES: tuple[Policy, ...] = ("pack", "one-per-worker")

# The MILP's modes (planning.ilp): replicate: replica counts are free; fixed: one per role.
Mode = Literal["replicate", "fixed"]
MODES: tuple[Mode, ...] = ("replicate", "fixed")

# The planner's local search budget after the MILP (planning.search), by default: with the MILP
# (well under a second) `moa-pd plan` decides in under 10 s; scoring the baselines comes on top.
SEARCH_SECONDS = 8.0


@dataclass(frozen=True, slots=True)
class GPU:
    index: int  # nvidia-smi's index (PCI bus order)
    name: str
    total_mib: int
    free_mib: int


@dataclass(frozen=True, slots=True)
class WorkerDemand:
    """What one worker (a prefill or decode replica of a model) needs, before it is placed."""

    model: str
    role: str  # "prefill" or "decode"
    replica: int
    tp: int  # tensor-parallel size: the worker spans this many GPUs
    weights_bytes: int  # all ranks together
    kv_bytes_per_token: int  # all ranks together
    pool_tokens: int  # the KV pool the config's agents need at the planned concurrency

    @property
    def name(self) -> str:
        """The worker's process name, as launch.stack names it."""
        return f"{self.model}.{self.role}{self.replica}"

    def bytes_per_gpu(self, pool_tokens: int, headroom_bytes: int) -> int:
        """Weights and pool are split over the TP ranks; each rank pays the headroom."""
        return -(-(self.weights_bytes + pool_tokens * self.kv_bytes_per_token) // self.tp) + (
            headroom_bytes
        )


@dataclass(frozen=True, slots=True)
class WorkerPlacement:
    demand: WorkerDemand
    gpus: tuple[int, ...]  # nvidia-smi indices, one per TP rank
    pool_tokens: int  # the pool it is started with (>= demand.pool_tokens)
    turn: int  # start order: turn k starts once every worker of turns < k is healthy
    # SGLang's, for its turn (pack.mem_fraction_static); None: SGLang's own (a plan's CPU worker)
    mem_fraction_static: float | None

    @property
    def name(self) -> str:
        return self.demand.name

    @property
    def weights_mib(self) -> float:
        return self.demand.weights_bytes / MIB

    @property
    def pool_mib(self) -> float:
        return self.pool_tokens * self.demand.kv_bytes_per_token / MIB


@dataclass(slots=True)
class Placement:
    """Every worker of a deployment on the GPUs it was planned for."""

    policy: Policy
    concurrency: int
    gpus: list[GPU]
    headroom_mib: int
    workers: list[WorkerPlacement] = field(default_factory=list)

    def worker(self, name: str) -> WorkerPlacement:
        for w in self.workers:
            if w.name == name:
                return w
        raise KeyError(name)

    def turns(self) -> list[list[WorkerPlacement]]:
        """Workers grouped by start turn: a group starts together, after the previous one."""
        n = max((w.turn for w in self.workers), default=-1) + 1
        return [[w for w in self.workers if w.turn == t] for t in range(n)]

    def used_mib(self, gpu: int) -> float:
        """Planned use of one GPU: its share of each worker's weights and pool, plus headroom."""
        return sum(
            (w.demand.weights_bytes + w.pool_tokens * w.demand.kv_bytes_per_token)
            / w.demand.tp
            / MIB
            + self.headroom_mib
            for w in self.workers
            if gpu in w.gpus
        )
