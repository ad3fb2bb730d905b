"""Pure arithmetic of the measurements: a decode step's time from streamed chunks' arrival times
(steady state only: every stream of the batch decoding), and medians."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass(slots=True)
class StreamTimes:
    """One streamed request: (arrival time, tokens generated so far) per chunk with tokens."""

    chunks: list[tuple[float, int]] = field(default_factory=list)

    @property
    def first(self) -> float:
        return self.chunks[0][0]

    @property
    def last(self) -> float:
        return self.chunks[-1][0]


def steady_window(streams: list[StreamTimes]) -> tuple[float, float]:
    """(start, end) of the span when every stream decodes: after the last one's first token,
    before the first one's last token. Empty (start >= end) when they never all overlapped."""
    return max(s.first for s in streams), min(s.last for s in streams)


def step_intervals(streams: list[StreamTimes]) -> list[float]:
    """Seconds per token of every chunk-to-chunk gap inside the steady window (a chunk carrying
    k tokens counts as k steps: SGLang may stream several tokens per chunk)."""
    start, end = steady_window(streams)
    out = []
    for s in streams:
        for (t0, n0), (t1, n1) in zip(s.chunks, s.chunks[1:]):
            if t0 >= start and t1 <= end and n1 > n0:
                out.append((t1 - t0) / (n1 - n0))
    return out


def tokens_needed(stagger_s: float, step_s: float, min_steps: int, floor: int) -> int:
    """max_new_tokens that leaves `min_steps` steady steps after the streams' starts spread over
    `stagger_s` (each stream's prefill queues behind the others'), with a 50% margin."""
    if step_s <= 0:
        return floor
    return max(floor, int(1.5 * (stagger_s / step_s + min_steps)) + 1)


def median(values: list[float]) -> float:
    return float(statistics.median(values))
