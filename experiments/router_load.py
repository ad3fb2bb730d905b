"""The shell router's own load per question and per setting: its CPU seconds and its event loop's
lag (router/loop_lag.py), from the `GET /v1/moa/stats` snapshots the runner takes before and after
each question (`RouterWindow`, a row's `router`).

A row's window holds whatever the router did meanwhile. At --concurrency 1 that is the row's own
question (plus its background work: health probes of every process twice a second, and the two
stats requests), so `window_values` gives per-row numbers. At higher concurrency the windows of a setting's questions overlap, and each
holds the others' work too: `setting_load` merges a setting's windows into disjoint spans and
divides the spans' total by the questions in them. That is right while one setting runs at a time
(at concurrency > 1 the runner runs the settings in blocks, one setting at a time);
overlapping settings would share their spans' load.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, ValidationError


class RouterSnapshot(BaseModel):
    """The router's cumulative counters at one instant."""

    model_config = ConfigDict(extra="allow")

    time_s: float  # the router's monotonic clock: orders the snapshots of one boot
    cpu_s: float
    lag_counts: list[int]  # cumulative: probe wakes at most `lag_le[i]` late
    lag_count: int  # every wake (the +Inf bucket)
    lag_sum: float


class RouterWindow(BaseModel):
    """A row's view of the router: snapshots from just before its request to just after."""

    model_config = ConfigDict(extra="allow")

    boot_id: str  # the router's counters (a restarted router starts new ones)
    alone: bool  # no other question was in flight (--concurrency 1)
    lag_le: list[float]  # the lag histogram's finite bucket bounds, seconds
    before: RouterSnapshot
    after: RouterSnapshot


def snapshot(stats: dict) -> RouterSnapshot:
    """A `GET /v1/moa/stats` reply as a snapshot."""
    lag = stats["event_loop_lag"]
    return RouterSnapshot(
        time_s=stats["time_s"],
        cpu_s=stats["cpu_s"],
        lag_counts=lag["counts"],
        lag_count=lag["count"],
        lag_sum=lag["sum"],
    )


def window(before: dict | None, after: dict | None, alone: bool) -> RouterWindow | None:
    """The window between two stats replies; None when either is missing (a router without
    /v1/moa/stats) or malformed, or the router restarted in between."""
    if before is None or after is None:
        return None
    try:
        le = before["event_loop_lag"]["le"]
        if before["boot_id"] != after["boot_id"] or after["event_loop_lag"]["le"] != le:
            return None
        return RouterWindow(
            boot_id=before["boot_id"],
            alone=alone,
            lag_le=le,
            before=snapshot(before),
            after=snapshot(after),
        )
    except (KeyError, TypeError, ValidationError):
        return None


def lag_quantile(le: Sequence[float], counts: Sequence[int], total: int, q: float) -> float | None:
    """The `q` quantile of lags whose cumulative bucket counts are `counts` (of `total`
    observations, +Inf included), as the upper bound of the bucket that holds it: the true value
    lies in that bucket, above the bound before it. A quantile past the last finite bound is
    reported as that bound (then read it as "at least"). None without observations."""
    if total <= 0:
        return None
    rank = max(1, math.ceil(q * total))
    for bound, c in zip(le, counts):
        if c >= rank:
            return bound
    return le[-1] if le else None


def window_values(w: RouterWindow | None) -> dict:
    """A row's own router CPU seconds and lag p99: only for a row that ran alone (at higher
    concurrency its window holds other questions' work)."""
    if w is None or not w.alone:
        return {"router_cpu_s": None, "router_lag_p99_s": None}
    counts = [a - b for a, b in zip(w.after.lag_counts, w.before.lag_counts)]
    total = w.after.lag_count - w.before.lag_count
    return {
        "router_cpu_s": w.after.cpu_s - w.before.cpu_s,
        "router_lag_p99_s": lag_quantile(w.lag_le, counts, total, 0.99),
    }


def merged_spans(windows: Sequence[RouterWindow]) -> list[tuple[RouterSnapshot, RouterSnapshot]]:
    """Overlapping windows (per boot) joined: (first snapshot, last snapshot) of each span."""
    spans: list[tuple[RouterSnapshot, RouterSnapshot]] = []
    for boot in sorted({w.boot_id for w in windows}):
        mine = sorted((w for w in windows if w.boot_id == boot), key=lambda w: w.before.time_s)
        start, end = mine[0].before, mine[0].after
        for w in mine[1:]:
            if w.before.time_s <= end.time_s:
                if w.after.time_s > end.time_s:
                    end = w.after
            else:
                spans.append((start, end))
                start, end = w.before, w.after
        spans.append((start, end))
    return spans


def setting_load(windows: Sequence[RouterWindow]) -> dict:
    """Per setting: router CPU seconds per question (the spans' CPU ÷ the windows in them),
    event-loop lag p50/p99 over every probe wake in the spans, and how many wakes that was.
    Empty without windows (rows of a runner or router that predates them)."""
    if not windows:
        return {}
    spans = merged_spans(windows)
    cpu = sum(b.cpu_s - a.cpu_s for a, b in spans)
    out = {"router_cpu_s_per_question": cpu / len(windows)}
    le = windows[0].lag_le
    if any(w.lag_le != le for w in windows):
        return out  # buckets changed between routers: their counts do not add up
    counts = [sum(b.lag_counts[i] - a.lag_counts[i] for a, b in spans) for i in range(len(le))]
    total = sum(b.lag_count - a.lag_count for a, b in spans)
    return out | {
        "event_loop_lag_p50_s": lag_quantile(le, counts, total, 0.5),
        "event_loop_lag_p99_s": lag_quantile(le, counts, total, 0.99),
        "event_loop_lag_samples": total,
    }
