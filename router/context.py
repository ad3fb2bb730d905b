"""What a running shell router shares across questions: the cluster, the one HTTP client session,
each model's Deployment, the tokenizers and the metrics. Built once per app (server.py) or per
test (`async with RouterContext.open(cluster)`)."""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import AsyncIterator

import aiohttp

from router.cluster import ClusterSpec
from router.compute_device import ComputeDevice
from router.config import TopologyConfig
from router.health_watch import HealthWatch
from router.metrics import RouterMetrics
from router.pd import Deployment
from router.priority import RequestOrder
from router.sglang_client import SGLangClient, WorkerError
from router.tokenizers import LoadedTokenizer, TokenizerStore

log = logging.getLogger(__name__)


class ConfigNotServed(ValueError):
    """A topology names a model the cluster does not serve."""


class RouterContext:
    def __init__(
        self,
        cluster: ClusterSpec,
        session: aiohttp.ClientSession,
        tokenizers: TokenizerStore | None = None,
        seed: int | None = None,
    ) -> None:
        self.cluster = cluster
        self.timeouts = cluster.timeouts
        # Probed by server.py's background task; sessions consult it and listen to it.
        self.health = HealthWatch(cluster, timeout_s=cluster.timeouts.health_probe_s)
        self.client = SGLangClient(session, cluster.timeouts.connect_s, cluster.timeouts.read_s)
        rng = random.Random(seed)
        scoped = cluster.warmup_gate and cluster.warmup_gate_scope == "device"
        self.metrics = RouterMetrics()
        # Numbers the questions as they arrive and values their requests' priority.
        self.order = RequestOrder(
            workflow=cluster.workflow_priority,
            critical_path_first=cluster.start_order == "critical_path",
        )
        self.devices = (
            {
                d: ComputeDevice(
                    d,
                    slots,
                    cluster.warmup_weigh_slowdown,
                    cluster.warmup_slowdown_confidence,
                )
                for d, slots in cluster.devices.items()
            }
            if scoped
            else {}
        )
        self.metrics.watch_devices(self.devices)
        self.deployments = {
            name: Deployment(
                name,
                spec,
                self.client,
                cluster.timeouts,
                cluster.warmup_verb,
                random.Random(rng.random()),
                send_priority=cluster.sends_priority(name),
                order=self.order,
                gate=cluster.warmup_gate,
                is_down=self.health.is_down,
                devices=self.devices,
                metrics=self.metrics,
            )
            for name, spec in cluster.models.items()
        }
        self.tokenizers = tokenizers or TokenizerStore()
        # Each model's context length (tokens): the cluster file's, or `load_context_lens`'.
        self.context_len: dict[str, int | None] = {
            name: spec.context_len for name, spec in cluster.models.items()
        }

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, cluster: ClusterSpec, **kwargs) -> AsyncIterator[RouterContext]:
        # No per-host connection cap: a 9-3-1 question holds ~13 streams to one router at once.
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            yield cls(cluster, session, **kwargs)

    async def load_context_lens(self) -> None:
        """Ask a prefill worker of each model whose context length the cluster file leaves out
        (`GET /v1/models`: SGLang and the reference engine report `max_model_len`). A worker that
        cannot tell leaves it unknown: prompts are then checked by the workers alone."""
        for name, spec in self.cluster.models.items():
            if self.context_len[name] is not None:
                continue
            url = f"{spec.prefill_urls[0]}/v1/models"
            try:
                reply = await self.client.get_json(url, "model info", self.timeouts.connect_s)
                data = reply.get("data") or [{}]
                value = data[0].get("max_model_len")
                self.context_len[name] = int(value) if value else None
            except (WorkerError, ValueError, TypeError, AttributeError) as e:
                log.warning("context length of %s unknown (%s: %s)", name, url, e)

    def tokenizer(self, model: str) -> LoadedTokenizer:
        return self.tokenizers.get(self.cluster.models[model].tokenizer_path)

    def check_served(self, cfg: TopologyConfig) -> None:
        """A clear error for a config this deployment cannot run (now): a model it does not
        serve (ConfigNotServed), or one whose worker is down (WorkerDown)."""
        missing = sorted({a.model for a in cfg.agents} - set(self.cluster.models))
        if missing:
            raise ConfigNotServed(
                f"topology '{cfg.name}' uses model(s) {', '.join(missing)} that this router does "
                f"not serve (served: {', '.join(sorted(self.cluster.models))}); start them with "
                "`moa-pd up` or fix the config"
            )
        self.health.check({a.model for a in cfg.agents})
