"""/metrics: Prometheus text from the engine's counters and page stats, `sglang:`-prefixed names.

Mounted by `server.py`. A per-app CollectorRegistry (no global registry), so many workers can live
in one test process; values are read at scrape time.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from sglang_ext.engine.http_utils import STATE

COUNTERS = {
    "requests": "requests received",
    "finished": "requests finished",
    "aborted": "requests aborted by clients",
    "failed": "requests failed",
    "prompt_tokens": "prompt tokens received",
    "cached_tokens": "prompt tokens from cache",
    "generated_tokens": "tokens generated",
    "forward_steps": "model forwards run",
}
GAUGES = (
    "num_running_reqs",
    "num_waiting_reqs",
    "total_pages",
    "free_pages",
    "cached_pages",
    "in_use_pages",
    "reserved_pages",
)


class EngineCollector:
    def __init__(self, app: web.Application):
        self.app = app

    def collect(self):
        engine = self.app[STATE].engine
        if engine is None:
            return
        # A racy read of plain ints is fine for metrics; it never blocks the engine thread.
        stats = dict(engine.sched.page_stats())
        model = self.app[STATE].args.model_name
        for name, help_text in COUNTERS.items():
            c = CounterMetricFamily(f"sglang:{name}", help_text, labels=["model_name"])
            c.add_metric([model], engine.counters[name])
            yield c
        for name in GAUGES:
            g = GaugeMetricFamily(f"sglang:{name}", name.replace("_", " "), labels=["model_name"])
            g.add_metric([model], stats[name])
            yield g


def add_metrics_route(app: web.Application) -> None:
    registry = CollectorRegistry()
    registry.register(EngineCollector(app))

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app.router.add_get("/metrics", metrics)
