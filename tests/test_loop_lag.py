"""The shell router's load instruments: the event-loop lag probe (router/loop_lag.py) sees a
blocked loop and stops clean; and the windows and per-setting numbers the runner and summary
derive from /v1/moa/stats snapshots (experiments/router_load.py)."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry, Histogram

from experiments.router_load import lag_quantile, setting_load, window, window_values
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


LE = [0.001, 0.01, 0.1, 1.0]


def _stats(boot: str, t: float, cpu: float, per_bucket: list[int], inf: int = 0) -> dict:
    """A /v1/moa/stats reply whose lag histogram holds `per_bucket` wakes in each bucket (not
    cumulative) and `inf` beyond the last bound."""
    counts = [sum(per_bucket[: i + 1]) for i in range(len(per_bucket))]
    return {
        "object": "moa.router_stats",
        "boot_id": boot,
        "time_s": t,
        "cpu_s": cpu,
        "event_loop_lag": {
            "period_s": 0.05,
            "le": LE,
            "counts": counts,
            "count": counts[-1] + inf,
            "sum": 0.0,
        },
    }


def test_quantile_is_the_upper_bound_of_its_bucket():
    # 100 wakes: 90 within 1 ms, 9 within 10 ms, 1 within 100 ms.
    counts = [90, 99, 100, 100]
    assert lag_quantile(LE, counts, 100, 0.5) == 0.001
    assert lag_quantile(LE, counts, 100, 0.9) == 0.001
    assert lag_quantile(LE, counts, 100, 0.99) == 0.01
    assert lag_quantile(LE, counts, 100, 1.0) == 0.1
    assert lag_quantile(LE, [0, 0, 0, 0], 2, 0.5) == 1.0  # past the last bound: reported there
    assert lag_quantile(LE, [0, 0, 0, 0], 0, 0.5) is None


def test_a_row_alone_has_its_own_numbers_and_a_concurrent_one_none():
    before = _stats("b", 10.0, 5.0, [50, 0, 0, 0])
    after = _stats("b", 12.0, 5.4, [139, 1, 0, 0])
    alone = window_values(window(before, after, alone=True))
    assert alone["router_cpu_s"] == pytest.approx(0.4)
    assert alone["router_lag_p99_s"] == 0.01  # 90 wakes, the last 1-10 ms late: p99 is rank 90
    assert window_values(window(before, after, alone=False)) == {
        "router_cpu_s": None,
        "router_lag_p99_s": None,
    }
    # No endpoint, a restarted router, a malformed reply: no window.
    assert window(None, after, True) is None
    assert window(before, _stats("other", 12.0, 0.1, [1, 0, 0, 0]), True) is None
    assert window(before, {"boot_id": "b"}, True) is None


def test_concurrent_windows_are_merged_and_divided_by_their_questions():
    s = [_stats("b", 10.0 * i, 1.0 * i, [100 * i, 0, 0, 0]) for i in range(10)]
    # Three questions at once: windows 0-3, 1-4, 3-5 overlap into one span 0-5 (5 s of CPU,
    # not the 3 + 3 + 2 their sum would say); one more later alone, 7-8 (1 s).
    ws = [window(s[a], s[b], alone=False) for a, b in ((0, 3), (1, 4), (3, 5), (7, 8))]
    load = setting_load(ws)
    assert load["router_cpu_s_per_question"] == pytest.approx((5 + 1) / 4)
    assert load["event_loop_lag_samples"] == 500 + 100
    assert load["event_loop_lag_p99_s"] == 0.001
    # Two routers (a resumed run): each boot's windows merge on their own.
    other = window(_stats("c", 0.0, 0.0, [0] * 4), _stats("c", 1.0, 2.0, [0, 0, 9, 1]), False)
    load = setting_load([*ws, other])
    assert load["router_cpu_s_per_question"] == pytest.approx((5 + 1 + 2) / 5)
    assert load["event_loop_lag_p99_s"] == 0.1  # 10 of 610 wakes past 1 ms: p99 is rank 604
    assert setting_load([]) == {}
