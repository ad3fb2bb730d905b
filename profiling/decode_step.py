"""Pure arithmetic of the measurements: a decode step's time from when batches of streams end,
and medians.

A step is not read off the gaps between streamed chunks: the client sees chunks when they reach
it, and under load (or behind the router) several arrive in one burst, so gaps of ~0 and gaps of
several steps alternate (measured on the reference engine: a whole 12-token stream in 0.2 ms).
When a request ends is not blurred that way. So the same B prompts run twice, to M1 and to M2
new tokens each; the part both runs share (sending, the cached prefills, the KV hops, the first
token) cancels in the difference of their finish times, which is M2 - M1 steps of a batch of B.
"""

from __future__ import annotations

import statistics


def step_seconds(finish_short: list[float], finish_long: list[float], extra_tokens: int) -> float:
    """Seconds per decode step from two runs of the same batch: each stream's time from sending
    to its last token, with `extra_tokens` more new tokens in the long run (medians over the
    streams). Zero or less means the extra tokens took no measurable time: the caller decides."""
    if extra_tokens < 1:
        raise ValueError("the long run needs more tokens than the short one")
    return (median(finish_long) - median(finish_short)) / extra_tokens


def median(values: list[float]) -> float:
    return float(statistics.median(values))
