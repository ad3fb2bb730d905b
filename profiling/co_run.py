"""How busy processes on a machine's cores slow each other, measured by a micro-benchmark of its
own (not fitted to any run the simulator is checked against): k single-threaded processes each
run a decode-like workload (a small model's matrix-vector products over weights far larger than
the caches, so memory-bound as a decode step is) at the same time, for k = 1 to twice the cores,
and each process's rate is compared with one process alone.

The simulator's device model (simulation/device.py) is processor sharing: k busy workers on n
cores each run at min(1, n / k) of their speed. What the machine loses beyond that is fitted
here to its two parameters: `co_run_slowdown` β (k <= n workers on separate cores share caches
and memory bandwidth, or are SMT siblings of a VM's vCPUs: each runs 1 / (1 + β (k - 1)) as
fast) and `oversubscribed_slowdown` γ (k > n workers time-sliced on n cores also pay for the
switches and for caches refilled: 1 / (1 + γ (k - n) / n) on top).

Why paired phases: a VM's speed drifts by minutes (single rounds of an earlier design, which
measured each k once per round against one alone-rate taken first, gave β from 0.05 to 0.28 on
this project's 2-core machine). Here the processes start once and keep their weights paged in,
and every k-phase sits between two alone-phases of the same process: its rate is compared with
their mean, which cancels a drift that is linear over the three phases."""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Self

# The workload: LAYERS weight matrices of HIDDEN x 4·HIDDEN float32 (SmolLM2-135M's MLP shape),
# ~300 MB in all, multiplied by one vector each, round after round.
HIDDEN, LAYERS = 576, 30
SECONDS = 1.5  # each phase's measured span
ROUNDS = 5


@dataclass(frozen=True, slots=True)
class CoRun:
    cores: int
    rates: dict[int, float]  # k processes -> their mean rate ÷ one process alone's (median)
    co_run_slowdown: float  # β
    oversubscribed_slowdown: float  # γ
    # β fitted to each round alone: how far one round strays from the median.
    round_slowdowns: tuple[float, ...] = ()


def _worker(commands: mp.Queue, out: mp.Queue) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    weights = [torch.randn(HIDDEN, 4 * HIDDEN) for _ in range(LAYERS)]
    x = torch.randn(1, HIDDEN)

    def one_round() -> None:
        for w in weights:
            (x @ w).sum()

    one_round()  # page the weights in
    out.put(None)
    while (seconds := commands.get()) is not None:
        rounds, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            one_round()
            rounds += 1
        out.put(rounds / (time.perf_counter() - t0))


class WorkerPool:
    """`size` processes running the workload, started once; `rates(k, s)` has the first k run it
    together for s seconds and returns each one's rounds per second. A context manager."""

    def __init__(self, size: int) -> None:
        ctx = mp.get_context("spawn")
        self._commands = [ctx.Queue() for _ in range(size)]
        self._out = ctx.Queue()
        self._procs = [
            ctx.Process(target=_worker, args=(q, self._out), daemon=True) for q in self._commands
        ]
        for p in self._procs:
            p.start()
        for _ in self._procs:  # every process built its weights and paged them in
            self._out.get(timeout=120)

    def rates(self, k: int, seconds: float) -> list[float]:
        for q in self._commands[:k]:
            q.put(seconds)
        return [self._out.get(timeout=60 + 10 * seconds) for _ in range(k)]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        for q in self._commands:
            q.put(None)
        for p in self._procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


def fit(cores: int, rates: dict[int, float]) -> tuple[float, float]:
    """(β, γ) from the relative rates: β from k <= cores (least squares of 1 / rate - 1 on k - 1),
    γ from k > cores after processor sharing and β are taken out. Negative fits (a machine that
    co-runs better than the model's ideal) are 0."""
    co = [(k - 1, 1 / r - 1) for k, r in rates.items() if 1 < k <= cores]
    beta = sum(x * y for x, y in co) / sum(x * x for x, _ in co) if co else 0.0
    beta = max(0.0, beta)
    over = []
    for k, r in rates.items():
        if k > cores:
            shared = (cores / k) / (1 + beta * (cores - 1))
            over.append(((k - cores) / cores, shared / r - 1))
    gamma = sum(x * y for x, y in over) / sum(x * x for x, _ in over) if over else 0.0
    return beta, max(0.0, gamma)


def phases(cores: int, rounds: int) -> int:
    """How many measured phases `paired_rates` runs (for a progress bar)."""
    return rounds * (2 * (2 * cores - 1) + 1)


def paired_rates(
    rate_of: Callable[[int], float], cores: int, rounds: int, progress=None
) -> list[dict[int, float]]:
    """Per round, each k = 2 .. 2·cores relative to one process alone: the phases run alone, k=2,
    alone, k=3, ..., alone, and each k's mean rate (`rate_of(k)`) is divided by the mean of the
    alone-phases just before and after it. `progress()` after each phase."""

    def measured(k: int) -> float:
        rate = rate_of(k)
        if progress is not None:
            progress()
        return rate

    per_round = []
    for _ in range(rounds):
        relative = {1: 1.0}
        before = measured(1)
        for k in range(2, 2 * cores + 1):
            together = measured(k)
            after = measured(1)
            relative[k] = together / ((before + after) / 2)
            before = after
        per_round.append(relative)
    return per_round


def measure(
    cores: int | None = None, seconds: float = SECONDS, rounds: int = ROUNDS, progress=None
) -> CoRun:
    """k = 1 .. 2·cores processes, paired with alone-phases (`paired_rates`), `rounds` times;
    the median over rounds of each k's relative rate is fitted. `progress()` after each phase."""
    cores = cores or len(os.sched_getaffinity(0))
    with WorkerPool(2 * cores) as pool:
        # The mean over the k processes: the scheduler need not share fairly within a phase, and
        # what the model predicts is the work done, all processes together.
        per_round = paired_rates(
            lambda k: statistics.fmean(pool.rates(k, seconds)), cores, rounds, progress
        )
    rates = {k: statistics.median(r[k] for r in per_round) for k in per_round[0]}
    beta, gamma = fit(cores, rates)
    return CoRun(cores, rates, beta, gamma, tuple(fit(cores, r)[0] for r in per_round))


if __name__ == "__main__":
    result = measure()
    print(result)
