"""The shell router's event-loop lag probe (router/loop_lag.py): it sees a blocked loop, fills its
histogram and stops clean."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry, Histogram

from router.loop_lag import LAG_BUCKETS_S, histogram_state, running_probe


class _Recorder:
    """Stands in for the histogram: keeps every observation."""

    def __init__(self) -> None:
        self.seen: list[float] = []

    def observe(self, v: float) -> None:
        self.seen.append(v)


async def test_probe_sees_a_blocked_loop_and_stops_clean():
    lags = _Recorder()
    async with running_probe(lags, period_s=0.05):
        await asyncio.sleep(0.12)  # a few quiet wakes
        quiet = list(lags.seen)
        # A callback holding the loop (on purpose): the probe's timer is due within 50 ms.
        time.sleep(0.3)  # noqa: ASYNC251
        await asyncio.sleep(0.12)
    assert quiet and max(quiet) < 0.25
    # The wake due during the block came at least 0.3 - 0.05 s late.
    assert max(lags.seen) >= 0.25
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "loop-lag-probe"]
    n = len(lags.seen)
    await asyncio.sleep(0.12)
    assert len(lags.seen) == n  # cancelled: observes nothing more


async def test_probe_fills_the_histogram_buckets():
    h = Histogram("lag_seconds", "lag", buckets=LAG_BUCKETS_S, registry=CollectorRegistry())
    async with running_probe(h, period_s=0.02):
        await asyncio.sleep(0.05)
        time.sleep(0.3)  # noqa: ASYNC251 - the stall the probe must see
        await asyncio.sleep(0.05)
    state = histogram_state(h)
    assert state["le"] == list(LAG_BUCKETS_S)
    assert state["count"] >= 3 and state["sum"] >= 0.28
    # Cumulative: the stall is above 0.25 s, so fewer wakes are at most 0.25 s late than all.
    assert state["counts"][LAG_BUCKETS_S.index(0.25)] < state["count"]
    assert state["counts"] == sorted(state["counts"])
