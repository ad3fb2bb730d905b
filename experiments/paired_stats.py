"""Uncertainty of paired comparisons between two settings on the same questions: a percentile
bootstrap CI of a statistic over per-question values, and McNemar's exact test for paired
correct/incorrect outcomes. numpy and the standard library only; called by experiments.summary
and the benchmark scripts."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

# Fixed so a summary recomputed from the same rows gives the same interval.
BOOTSTRAP_SEED = 20251125
BOOTSTRAP_RESAMPLES = 10_000


def bootstrap_ci(
    values: Sequence[float],
    stat: Callable[[np.ndarray], np.ndarray] = lambda a: np.median(a, axis=-1),
    level: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of `stat` (vectorized over the last axis) over `values`,
    resampling questions with replacement. None with fewer than 2 values (no spread to see)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        return None
    rng = np.random.default_rng(seed)
    samples = x[rng.integers(0, x.size, size=(resamples, x.size))]
    stats = stat(samples)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(stats, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


class McNemar(NamedTuple):
    n: int  # questions both settings graded
    only_a: int  # correct under setting a only
    only_b: int  # correct under setting b only
    p_value: float  # exact two-sided (binomial on the discordant pairs); 1.0 with none


def mcnemar(a: Sequence[bool], b: Sequence[bool]) -> McNemar:
    """McNemar's exact test on paired outcomes a[i], b[i] of the same questions."""
    if len(a) != len(b):
        raise ValueError("paired outcomes need one entry per question in both lists")
    only_a = sum(1 for x, y in zip(a, b) if x and not y)
    only_b = sum(1 for x, y in zip(a, b) if y and not x)
    n = only_a + only_b
    if n == 0:
        return McNemar(len(a), 0, 0, 1.0)
    k = min(only_a, only_b)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n
    return McNemar(len(a), only_a, only_b, min(1.0, 2.0 * tail))
