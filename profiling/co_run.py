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
switches and for caches refilled: 1 / (1 + γ (k - n) / n) on top)."""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from dataclasses import dataclass

# The workload: LAYERS weight matrices of HIDDEN x 4·HIDDEN float32 (SmolLM2-135M's MLP shape),
# ~300 MB in all, multiplied by one vector each, round after round.
HIDDEN, LAYERS = 576, 30
SECONDS = 3.0  # each process's measured span (after a warm-up round)
ROUNDS = 3


@dataclass(frozen=True, slots=True)
class CoRun:
    cores: int
    rates: dict[int, float]  # k processes -> their mean rate ÷ one process alone's
    co_run_slowdown: float  # β
    oversubscribed_slowdown: float  # γ


def _worker(ready: mp.Queue, start: mp.Event, out: mp.Queue, seconds: float) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    weights = [torch.randn(HIDDEN, 4 * HIDDEN) for _ in range(LAYERS)]
    x = torch.randn(1, HIDDEN)

    def one_round() -> None:
        for w in weights:
            (x @ w).sum()

    one_round()  # page the weights in
    ready.put(True)
    start.wait()
    rounds, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        one_round()
        rounds += 1
    out.put(rounds / (time.perf_counter() - t0))


def rates_of(k: int, seconds: float = SECONDS) -> list[float]:
    """Rounds per second of each of k processes running the workload at once."""
    ctx = mp.get_context("spawn")
    ready, start, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(ready, start, out, seconds)) for _ in range(k)]
    for p in procs:
        p.start()
    for _ in procs:  # every process built its weights and paged them in
        ready.get(timeout=120)
    start.set()
    got = [out.get(timeout=60 + 10 * seconds) for _ in procs]
    for p in procs:
        p.join()
    return got


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


def measure(
    cores: int | None = None, seconds: float = SECONDS, rounds: int = ROUNDS, progress=None
) -> CoRun:
    """k = 1 .. 2·cores processes, in `rounds` rounds; each round's rates relative to its own
    one-process rate (a VM's speed drifts between minutes), the median over rounds. `progress()`
    after each measurement."""
    cores = cores or len(os.sched_getaffinity(0))
    relative: dict[int, list[float]] = {k: [] for k in range(1, 2 * cores + 1)}
    for _ in range(rounds):
        alone = None
        for k, seen in relative.items():
            # The mean: the scheduler need not share fairly within a few seconds, and what the
            # model predicts is the work done, all processes together.
            mean = sum(rates_of(k, seconds)) / k
            alone = alone or mean
            seen.append(mean / alone)
            if progress is not None:
                progress()
    rates = {k: statistics.median(v) for k, v in relative.items()}
    beta, gamma = fit(cores, rates)
    return CoRun(cores, rates, beta, gamma)


if __name__ == "__main__":
    result = measure()
    print(result)
