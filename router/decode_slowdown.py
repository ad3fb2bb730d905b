"""How much a warm-up slows the decodes that share its compute device, measured by the router
from the decode chunks it already streams (issue 28: "no decode stream on the same device is
slowed: measure it, not only by counting slots").

Why measured: on a device whose prefill and decode workers share cores (the CPU default: one PD
pair on two cores, beside the router), a warm-up slows the decodes beside it by what slot
counting cannot see (memory bandwidth, the router's own CPU per warm-up, shared caches), and by
how much differs by machine, model and batch.

How. Each decode stream delivers one chunk per decode step, so the gap between two chunks of a
stream is one step's time, and a step is one unit of progress. Time is cut into segments in
which nothing else changes the step time (the same decode streams open, the same critical
prefills outstanding: a change is a "disturbance"; a segment is also cut after `max_segment_s`,
so that a slow drift stays local). In a segment, the gaps no warm-up overlapped give the
undisturbed rate r0 (steps per second). A gap with c seconds cold and o seconds beside a
warm-up made one step of progress, c·r0 of it in the cold part, so 1 − c·r0 in the warm part;
over the segment's warm gaps, `actual` = Σ (1 − c·r0) steps were made in Σ o warm seconds where
`expected` = r0 · Σ o would have been made alone. Over the last `window` segments, slowdown =
Σ expected ÷ Σ actual − 1 (a ratio of sums: one gap is noisy).

Counting chunks inside the warm-ups' own windows instead (the first version) read a slowdown
where there was none: a warm-up is sent when a step's chunks arrive (they complete its chunk),
so a warm-up shorter than a step often holds no chunk at all. Whole gaps split by time do not
depend on when a warm-up starts (tests/test_decode_slowdown.py simulates both).

This is the project's own idea (nothing measures co-run interference from a client's streams);
router/compute_device.py decides with it.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Hashable


class DecodeSlowdown:
    def __init__(
        self,
        window: int = 64,
        min_segments: int = 4,
        min_expected: float = 10.0,
        min_part_s: float = 0.05,
        max_segment_s: float = 5.0,
        remeasure_after_s: float = 120.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """`window`: segments kept (the newest); below `min_segments` of them or `min_expected`
        steps expected beside warm-ups in all, the slowdown is unknown (None). A segment counts
        only if its gaps spent at least `min_part_s` both with and without a warm-up.
        `remeasure_after_s`: a gate that refuses every warm-up on the reading gets no new
        segment (each needs a warm-up), so the reading would stand for as long as the load
        lasts; once it has refused for that long without a warm-up admitted (`refused`, each
        refusal less than `max_segment_s` after the one before: a pause, such as a block of
        another setting, starts the count again), it is forgotten, and warm-ups are admitted by
        slots until a new one is measured."""
        if min_segments < 2:
            raise ValueError("min_segments must be at least 2: a standard error needs two")
        self._clock = clock
        self._min_segments, self._min_expected = min_segments, min_expected
        self._min_part_s, self._max_segment_s = min_part_s, max_segment_s
        self._remeasure_after_s = remeasure_after_s
        self._refusing_since: float | None = None  # refusals since then, none admitted
        self._last_refusal = -math.inf
        self._segments: deque[tuple[float, float]] = deque(maxlen=window)  # (expected, actual)
        # The ratio and its standard error, computed when a segment is kept: the gate reads them
        # at every wake of a queued warm-up, the segments change a few times a second at most.
        self._estimate: tuple[float, float] | None = None
        self._last: dict[Hashable, float] = {}  # each open stream's last chunk
        self._warmups = 0
        self._warm_since = 0.0
        self._open(clock())

    # --- what the device reports ----------------------------------------------------------------
    def chunk(self, stream: Hashable) -> None:
        """A decode chunk of `stream` arrived from a worker on the device."""
        now = self._clock()
        self._roll(now)
        last, self._last[stream] = self._last.get(stream), now
        if last is not None:  # else the stream's first gap
            self._gaps(last, now, 1)

    def steps(self, since: float, count: int) -> None:
        """`count` streams' chunks arrived now, each stream's previous chunk at `since`: what
        `count` calls of `chunk` measure, in one (the simulator's decode steps, whose streams
        share their step times: simulation/gate.py)."""
        now = self._clock()
        self._roll(now)
        self._gaps(since, now, count)

    def _gaps(self, last: float, now: float, count: int) -> None:
        if last < self._seg_start:
            return  # a gap that began in an earlier segment
        warm = self._overlap(last, now)
        if warm == 0.0:
            self._cold_steps += count
            self._cold_s += count * (now - last)
        else:
            self._warm_steps += count
            self._warm_cold_s += count * (now - last - warm)
            self._warm_s += count * warm

    def stream_ended(self, stream: Hashable) -> None:
        self._last.pop(stream, None)

    def disturbed(self) -> None:
        """The open decode streams or the critical prefills on the device changed."""
        self._close(self._clock())

    def refused(self) -> None:
        """The gate refused a warm-up on this reading (router/compute_device.py)."""
        now = self._clock()
        if self._refusing_since is None or now - self._last_refusal > self._max_segment_s:
            self._refusing_since = now
        self._last_refusal = now
        if now - self._refusing_since > self._remeasure_after_s:
            self._segments.clear()
            self._estimate = None
            self._refusing_since = None

    def warmup_started(self) -> None:
        now = self._clock()
        self._refusing_since = None
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
        """The fraction by which a warm-up stretches the decode steps beside it (0.2: they take
        1.2× as long), or None while too little was measured. Never below 0: a warm-up does not
        speed decoding up, so a negative estimate is noise."""
        return self.shifted(0.0)

    def shifted(self, z: float) -> float | None:
        """The slowdown `z` standard errors below its estimate (above for a negative `z`; never
        below 0), None while unknown: a confidence bound, which the gate may weigh instead of
        the estimate (router/compute_device.py)."""
        if self._estimate is None:
            return None
        ratio, stderr = self._estimate
        return max(0.0, ratio - 1.0 - z * stderr)

    def stderr(self) -> float | None:
        return None if self._estimate is None else self._estimate[1]

    def _ratio(self) -> tuple[float, float] | None:
        """Σ expected ÷ Σ actual over the kept segments and its standard error, by the delta
        method for a ratio of sums with the segment as the unit (each segment's residual
        expected − ratio × actual, scaled by Σ actual): a segment's steps are correlated, the
        segments far less so."""
        expected = sum(e for e, _ in self._segments)
        actual = sum(a for _, a in self._segments)
        n = len(self._segments)
        if n < self._min_segments or expected < self._min_expected:
            return None
        if actual <= 0:
            return float("inf"), 0.0
        ratio = expected / actual
        squares = sum((e - ratio * a) ** 2 for e, a in self._segments)
        return ratio, math.sqrt(n / (n - 1) * squares) / actual

    # --- segments --------------------------------------------------------------------------------
    def _overlap(self, a: float, b: float) -> float:
        """Seconds of [a, b] with a warm-up in flight (this segment's warm periods)."""
        periods = list(self._warm)
        if self._warmups > 0:
            periods.append((max(self._warm_since, self._seg_start), b))
        return sum(max(0.0, min(b, y) - max(a, x)) for x, y in periods)

    def _roll(self, now: float) -> None:
        if now - self._seg_start > self._max_segment_s:
            self._close(now)

    def _close(self, now: float) -> None:
        """End the open segment at `now`, keep what it measured, open the next."""
        if self._cold_s >= self._min_part_s and self._warm_s >= self._min_part_s:
            r0 = self._cold_steps / self._cold_s
            expected = r0 * self._warm_s
            actual = self._warm_steps - r0 * self._warm_cold_s
            self._segments.append((expected, actual))
            self._estimate = self._ratio()
        self._open(now)

    def _open(self, now: float) -> None:
        self._seg_start = now
        self._warm: list[tuple[float, float]] = []  # warm periods ended in this segment
        self._cold_steps, self._cold_s = 0, 0.0  # gaps no warm-up overlapped
        self._warm_steps, self._warm_s, self._warm_cold_s = 0, 0.0, 0.0  # gaps one did
