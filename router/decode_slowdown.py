"""How much a warm-up slows the decodes that share its compute device, measured by the router
from the decode chunks it already streams (issue 28: "no decode stream on the same device is
slowed: measure it, not only by counting slots").

Why measured: on a device whose prefill and decode workers share cores (the CPU default: one PD
pair on two cores, beside the router), a warm-up slows the decodes beside it by what slot
counting cannot see (memory bandwidth, the router's own CPU per warm-up, shared caches), and by
how much differs by machine, model and batch.

How: time is cut into segments in which nothing else changes the decode chunk rate (the same
decode streams open, the same critical prefills outstanding: a change is a "disturbance"; a
segment is also cut after `max_segment_s`, so that a slow drift of the rate stays local). Within
a segment, the chunks that arrived while no warm-up ran give the undisturbed rate; at that rate
the time with a warm-up in flight should have seen `expected` chunks, and it saw `actual`. Over
the last `window` segments, slowdown = Σ expected ÷ Σ actual − 1: a ratio of sums, since one
segment holds a few decode steps at most (chunks of a batch arrive together). Warm-ups that run
back to back are measured too (unlike a comparison with a warm-up-free window before each one).

This is the project's own idea (nothing measures co-run interference from a client's streams);
router/compute_device.py decides with it.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable


class DecodeSlowdown:
    def __init__(
        self,
        window: int = 64,
        min_segments: int = 4,
        min_chunks: int = 40,
        min_part_s: float = 0.05,
        max_segment_s: float = 5.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """`window`: segments kept (the newest); below `min_segments` of them or `min_chunks`
        expected chunks in all, the slowdown is unknown (None). A segment counts only if it
        spent at least `min_part_s` both with and without a warm-up in flight."""
        self._clock = clock
        self._min_segments, self._min_chunks, self._min_part_s = (
            min_segments,
            min_chunks,
            min_part_s,
        )
        self._max_segment_s = max_segment_s
        self._chunks: deque[float] = deque()  # arrival times, within the open segment
        self._segments: deque[tuple[float, int]] = deque(maxlen=window)  # (expected, actual)
        self._seg_start = clock()
        self._warm: list[tuple[float, float]] = []  # warm periods ended in the open segment
        self._warmups = 0
        self._warm_since = 0.0

    # --- what the device reports ----------------------------------------------------------------
    def chunk(self) -> None:
        """A decode chunk arrived from a worker on the device."""
        now = self._clock()
        self._roll(now)
        self._chunks.append(now)

    def disturbed(self) -> None:
        """The open decode streams or the critical prefills on the device changed."""
        self._close(self._clock())

    def warmup_started(self) -> None:
        now = self._clock()
        self._roll(now)
        if self._warmups == 0:
            self._warm_since = now
        self._warmups += 1

    def warmup_ended(self) -> None:
        now = self._clock()
        self._roll(now)
        self._warmups -= 1
        if self._warmups == 0:
            self._warm.append((max(self._warm_since, self._seg_start), now))

    # --- what the device reads -------------------------------------------------------------------
    @property
    def segments(self) -> int:
        return len(self._segments)

    def slowdown(self) -> float | None:
        """The fraction by which a warm-up stretches the decodes beside it (0.2: they run at
        1/1.2 of their speed), or None while too little was measured. Never below 0: a warm-up
        does not speed decoding up, so a negative estimate is noise."""
        expected = sum(e for e, _ in self._segments)
        actual = sum(a for _, a in self._segments)
        if len(self._segments) < self._min_segments or expected < self._min_chunks:
            return None
        if actual == 0:
            return float("inf")
        return max(0.0, expected / actual - 1.0)

    # --- segments --------------------------------------------------------------------------------
    def _roll(self, now: float) -> None:
        if now - self._seg_start > self._max_segment_s:
            self._close(now)

    def _close(self, now: float) -> None:
        """End the open segment at `now`, keep what it measured, open the next."""
        warm = list(self._warm)
        if self._warmups > 0:  # a warm period goes on into the next segment
            warm.append((max(self._warm_since, self._seg_start), now))
        warm_s = sum(b - a for a, b in warm)
        cold_s = now - self._seg_start - warm_s
        if warm_s >= self._min_part_s and cold_s >= self._min_part_s:
            times = list(self._chunks)
            actual = sum(
                bisect.bisect_left(times, b) - bisect.bisect_left(times, a) for a, b in warm
            )
            cold = len(times) - actual
            if cold + actual:
                self._segments.append((cold / cold_s * warm_s, actual))
        self._seg_start = now
        self._chunks.clear()
        self._warm.clear()
