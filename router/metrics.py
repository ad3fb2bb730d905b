"""Prometheus metrics of one router app, in their own registry (many apps can share a process).
Updated by the orchestrator, agent runner and server; served at /metrics."""

from __future__ import annotations

import time
import uuid

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from router.loop_lag import LAG_BUCKETS_S, PERIOD_S, CpuCollector, cpu_seconds, histogram_state
from router.trace import AgentTrace


class WorkerLoad:
    """One request in flight on one worker; `end` (idempotent) takes it off the gauge."""

    __slots__ = ("_gauge",)

    def __init__(self, gauge: Gauge) -> None:
        gauge.inc()
        self._gauge: Gauge | None = gauge

    def end(self) -> None:
        gauge, self._gauge = self._gauge, None
        if gauge is not None:
            gauge.dec()


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "moa_requests_total",
            "HTTP requests by endpoint and status",
            ["endpoint", "status"],
            registry=self.registry,
        )
        self.agents = Counter(
            "moa_agents_total",
            "Agent runs by outcome",
            ["model", "outcome"],
            registry=self.registry,
        )
        self.warmups = Counter(
            "moa_warmups_total", "Prefill-only warm-ups sent", ["model"], registry=self.registry
        )
        self.warmup_tokens = Counter(
            "moa_warmup_tokens_total",
            "Tokens carried by warm-ups",
            ["model"],
            registry=self.registry,
        )
        self.cached_ratio = Histogram(
            "moa_cached_token_ratio",
            "cached_tokens / prompt_tokens of successors' final requests",
            ["model", "mode"],
            buckets=(0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0),
            registry=self.registry,
        )
        self.layer_latency = Histogram(
            "moa_layer_latency_seconds",
            "Wall time of each layer of a question: its last agent's end minus its first agent's start",
            ["layer", "mode"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=self.registry,
        )

        # Per-replica load, as the shell router sends it (router/pd.py): a prefill worker holds a
        # request until its prefill reply, a decode worker until the stream ends. Requests
        # through a model's native sglang-router (benchmarks that compare it), which picks the
        # pair itself, count as role "router", replica "native".
        self.worker_in_flight = Gauge(
            "moa_worker_requests_in_flight",
            "Requests in flight on each worker (warm-ups included)",
            ["model", "role", "replica"],
            registry=self.registry,
        )
        self.worker_requests = Counter(
            "moa_worker_requests_total",
            "Requests sent to each worker (warm-ups included)",
            ["model", "role", "replica"],
            registry=self.registry,
        )

        # How busy the router itself is (loop_lag.py): its event loop's lag, sampled every
        # PERIOD_S by a probe the app runs, and its process's CPU seconds.
        self.loop_lag = Histogram(
            "moa_router_event_loop_lag_seconds",
            f"How late a {PERIOD_S * 1000:g} ms asyncio timer of the shell router fires",
            buckets=LAG_BUCKETS_S,
            registry=self.registry,
        )
        self.registry.register(CpuCollector())
        # Names this set of counters: a snapshot of another id (the router restarted) is not
        # comparable with this one's.
        self.boot_id = uuid.uuid4().hex[:12]

    def watch_devices(self, devices: dict) -> None:
        """Export each shared compute device's measured warm-up slowdown of its decodes
        (router/decode_slowdown.py; NaN until measured)."""
        gauge = Gauge(
            "moa_device_warmup_decode_slowdown",
            "How much a warm-up slows the decodes on its compute device (0.2: they run at "
            "1/1.2 of their speed), as the router measures it; NaN until measured",
            ["device"],
            registry=self.registry,
        )
        bound = Gauge(
            "moa_device_warmup_decode_slowdown_weighed",
            "The measured slowdown as the warm-up gate weighs it: its confidence bound at "
            "cluster.json's warmup_slowdown_confidence (0.5: the estimate); NaN until measured",
            ["device"],
            registry=self.registry,
        )
        for name, device in devices.items():
            gauge.labels(name).set_function(lambda d=device: _nan(d.slowdown.slowdown()))
            bound.labels(name).set_function(lambda d=device: _nan(d.slowdown.shifted(d.z)))

    def stats(self) -> dict:
        """The router's load counters at this instant (`GET /v1/moa/stats`): the runner takes
        one before and one after each question and attributes the difference. `time_s` is this
        process's monotonic clock, which orders the snapshots of one `boot_id`."""
        return {
            "object": "moa.router_stats",
            "boot_id": self.boot_id,
            "time_s": time.monotonic(),
            "cpu_s": cpu_seconds(),
            "event_loop_lag": {"period_s": PERIOD_S, **histogram_state(self.loop_lag)},
        }

    def worker_load(self, model: str, role: str, replica: int | str) -> WorkerLoad:
        """Count one request sent to a worker; end the returned load when it is over there."""
        self.worker_requests.labels(model, role, str(replica)).inc()
        return WorkerLoad(self.worker_in_flight.labels(model, role, str(replica)))

    def observe_layers(self, traces: list[AgentTrace], mode: str) -> None:
        """One question's layer latencies: a layer lasts from its first agent's start to its
        last agent's end (agents that never started are left out)."""
        spans: dict[int, list[AgentTrace]] = {}
        for t in traces:
            if t.start_s is not None and t.end_s is not None:
                spans.setdefault(t.layer, []).append(t)
        for layer, ts in spans.items():
            seconds = max(t.end_s for t in ts) - min(t.start_s for t in ts)
            self.layer_latency.labels(str(layer), mode).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value
