"""How busy the shell router's event loop is: a lag probe and the process's CPU time.

The probe is a task that sleeps `PERIOD_S` again and again and observes, into a histogram, how
much later than asked each sleep ended (`actual wake - expected wake`): while a callback holds the
loop (tokenizing, splicing, parsing a stream, a blocking call by mistake) every timer, socket read
and stream due then waits as long. `RouterMetrics` (metrics.py) owns the histogram and the CPU
counter; server.py starts the probe with the app; `GET /v1/moa/stats` and `/metrics` expose both.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

# 50 ms: 20 samples a second gives a p99 over a few seconds of load (a question lasts seconds),
# while the probe's own cost (one timer and one observation per wake, a few µs) stays far below
# 0.1% of a core. A shorter period would add samples, not resolution: a lag shorter than the
# period is seen in full by the wake it delays, a longer one by the wake it delays first.
PERIOD_S = 0.05
# 0.1 ms .. 2 s (5 s for a stall): an idle loop wakes ~0-1 ms late (epoll's timeout is in whole
# milliseconds), a busy one a few ms, a blocking call in the loop hundreds.
LAG_BUCKETS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.0,
    5.0,
)


async def probe_loop_lag(histogram: Histogram, period_s: float = PERIOD_S) -> None:
    """Observe the lag of one `period_s` timer after another into `histogram`, until cancelled.
    Each wake is measured on its own (its sleep starts when the previous one ended), so one long
    stall is one large sample, not a run of catching-up ones."""
    loop = asyncio.get_running_loop()
    while True:
        expected = loop.time() + period_s
        await asyncio.sleep(period_s)
        histogram.observe(max(0.0, loop.time() - expected))


@contextlib.asynccontextmanager
async def running_probe(histogram: Histogram, period_s: float = PERIOD_S) -> AsyncIterator[None]:
    """The probe as a task for the block's duration, cancelled and awaited on the way out."""
    task = asyncio.create_task(probe_loop_lag(histogram, period_s), name="loop-lag-probe")
    try:
        yield
    finally:
        task.cancel()
        await asyncio.wait([task])


def cpu_seconds() -> float:
    """User + system CPU seconds of this process, every thread included (tokenizing and the
    embedding model run in threads; their CPU is the router's too)."""
    return time.process_time()


class CpuCollector(Collector):
    """`moa_router_cpu_seconds_total`, read at each scrape. prometheus_client's
    `process_cpu_seconds_total` lives in its global registry, not the per-app one of
    `RouterMetrics`, and counts /proc clock ticks (10 ms); `time.process_time` is exact."""

    def collect(self) -> Iterable[CounterMetricFamily]:
        yield CounterMetricFamily(
            "moa_router_cpu_seconds",
            "CPU seconds (user + system, all threads) of the shell router's process",
            value=cpu_seconds(),
        )


def histogram_state(histogram: Histogram) -> dict:
    """An unlabelled histogram's state: bucket upper bounds `le` (finite ones; +Inf is implied
    by `count`), the cumulative count of observations ≤ each, `count` and `sum`."""
    le, counts, total, count = [], [], 0.0, 0
    for metric in histogram.collect():
        for s in metric.samples:
            if s.name.endswith("_bucket"):
                bound = float(s.labels["le"])
                if bound != float("inf"):
                    le.append(bound)
                    counts.append(int(s.value))
            elif s.name.endswith("_count"):
                count = int(s.value)
            elif s.name.endswith("_sum"):
                total = s.value
    return {"le": le, "counts": counts, "count": count, "sum": total}
