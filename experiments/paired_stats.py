"""Uncertainty of paired comparisons between two settings on the same questions: a percentile
bootstrap CI of a statistic over per-question values, and McNemar's exact test for paired
correct/incorrect outcomes. Thin wrappers over scipy.stats (`bootstrap`, `binomtest`) that fix
the seed and the conventions; called by experiments.summary and the benchmark scripts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
from scipy import stats

# Fixed so a summary recomputed from the same rows gives the same interval.
BOOTSTRAP_SEED = 20251125
BOOTSTRAP_RESAMPLES = 10_000


def bootstrap_ci(
    values: Sequence[float],
    stat: Callable[..., np.ndarray] = np.median,
    level: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of `stat` over `values`, resampling questions with
    replacement. `stat(x, axis=-1)` must reduce along `axis` (numpy's reductions do). None with
    fewer than 2 values (no spread to see)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        return None
    res = stats.bootstrap(
        (x,),
        stat,
        confidence_level=level,
        n_resamples=resamples,
        method="percentile",
        vectorized=True,
        random_state=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def median_ci(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, low, high): the median with its 95% percentile-bootstrap interval (the
    interval is the median itself, twice, with fewer than 2 values)."""
    m = float(np.median(np.asarray(values, dtype=np.float64)))
    lo, hi = bootstrap_ci(values) or (m, m)
    return m, lo, hi


class McNemar(NamedTuple):
    n: int  # questions both settings graded
    only_a: int  # correct under setting a only
    only_b: int  # correct under setting b only
    p_value: float  # exact two-sided (binomial on the discordant pairs); 1.0 with none


def mcnemar(a: Sequence[bool], b: Sequence[bool]) -> McNemar:
    """McNemar's exact test on paired outcomes a[i], b[i] of the same questions: a two-sided
    binomial test of the discordant pairs against p = 1/2."""
    if len(a) != len(b):
        raise ValueError("paired outcomes need one entry per question in both lists")
    only_a = sum(1 for x, y in zip(a, b) if x and not y)
    only_b = sum(1 for x, y in zip(a, b) if y and not x)
    n = only_a + only_b
    if n == 0:
        return McNemar(len(a), 0, 0, 1.0)
    p = stats.binomtest(only_a, n, 0.5, alternative="two-sided").pvalue
    return McNemar(len(a), only_a, only_b, float(min(1.0, p)))
