"""Routing wired into a question: `PoolRouter(session)` embeds the query on the embedding
service's thread, scores every candidate with the config's scorer, ranks and chooses
(routing/choose.py) and returns the decision, timed. `PoolRouters` is the per-process factory
(one scorer and one set of estimates per config, loaded once)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from router.config import TopologyConfig
from router.config_loader import ConfigError
from router.embedder import EmbedderError
from routing.choose import RoutingDecision, choose
from routing.estimates import Estimate, estimate_pool
from routing.posterior_hook import PosteriorHook
from routing.query_embedding import pool_tokens
from routing.routing_files import RoutingFiles, check_scorer
from routing.scorer_file import Scorer

if TYPE_CHECKING:
    from router.early_exit_hook import EmbeddingService
    from router.orchestrator import Session


def load_scorer(cfg: TopologyConfig, source: str, files: RoutingFiles | None = None) -> Scorer:
    """The config's scorer from `files` (by default, read from the path it names), checked
    against its pool; ConfigError naming what is wrong."""
    files = files if files is not None else RoutingFiles.trusting()
    scorer = files.scorer(cfg.routing.scorer, source)
    check_scorer(cfg, scorer, source, cfg.routing.scorer)
    return scorer


class PoolRouter:
    """One config's routing: `await router(session)` → the question's RoutingDecision."""

    def __init__(
        self,
        cfg: TopologyConfig,
        scorer: Scorer,
        estimates: dict[str, Estimate],
        embeddings: EmbeddingService,
    ) -> None:
        self.cfg, self.scorer, self.estimates = cfg, scorer, estimates
        self._embeddings = embeddings

    def check(self) -> None:
        """Load and run the embedding model once (EmbedderError), and check that its width is
        the scorer's (ValueError): a mismatch would fail every question instead."""
        self._embeddings.check()
        width = self._embeddings.width()
        if width is not None and width != self.scorer.dim:
            raise ValueError(
                f"the scorer takes {self.scorer.dim}-dimensional embeddings, but "
                f"'{self.cfg.early_exit.embedding_model}' gives {width}; retrain the scorer"
            )

    async def __call__(self, session: Session) -> RoutingDecision:
        start = time.perf_counter()
        tokens, embed_s = await self._embeddings.embed(session.question)
        query = pool_tokens(np.asarray(tokens))
        p, lengths = self.scorer.predict(query), self.scorer.predict_tokens(query)
        decision = choose(p, self.estimates, self.cfg.routing, self.cfg.pool_ids, lengths)
        decision.embed_s = embed_s
        decision.wall_s = time.perf_counter() - start
        return decision


def _routing_view(cfg: TopologyConfig) -> tuple:
    """What a PoolRouter depends on: a request that only changes the final agent's sampling
    (an OpenAI max_tokens) reuses the loaded scorer."""
    return (
        cfg.routing,
        cfg.pool,
        cfg.models,
        cfg.early_exit.embedding_model,
        [cfg.sampling_of(c) for c in cfg.pool_ids],
    )


class PoolRouters:
    """Per router process: `routers(cfg)` → that config's PoolRouter (None without routing).
    `embedding(name)` gives the embedding service of a model name (the early-exit hooks' own,
    so one MiniLM serves both). `files` holds the scorers and profiles (the shell router's:
    those it loaded at start and those registered inline, never a path a request names); by
    default any path a config names is read."""

    def __init__(self, embedding: Callable[[str], Any], files: RoutingFiles | None = None) -> None:
        self._embedding = embedding
        self.files = files if files is not None else RoutingFiles.trusting()
        self._by_config: dict[str, tuple[TopologyConfig, PoolRouter]] = {}

    def __call__(self, cfg: TopologyConfig) -> PoolRouter | None:
        if cfg.routing is None:
            return None
        cached = self._by_config.get(cfg.name)
        if cached is None or _routing_view(cached[0]) != _routing_view(cfg):
            source = f"config '{cfg.name}'"
            router = PoolRouter(
                cfg,
                load_scorer(cfg, source, self.files),
                estimate_pool(cfg, source, self.files),
                self._embedding(cfg.early_exit.embedding_model),
            )
            cached = self._by_config[cfg.name] = (cfg, router)
        return cached[1]

    def posterior(self, cfg: TopologyConfig) -> PosteriorHook | None:
        """The question's posterior correction, when the config's routing turns it on."""
        if cfg.routing is None or not cfg.routing.posterior_correction.enabled:
            return None
        return PosteriorHook(
            cfg.routing.posterior_correction, self._embedding(cfg.early_exit.embedding_model)
        )

    def check(self, configs) -> None:
        """Load every routed config's scorer and estimates now (ConfigError): a missing scorer
        stops the router at start-up, not inside a question."""
        for cfg in configs:
            try:
                router = self(cfg)
                if router is not None:  # the embedder runs now, and gives the scorer's width
                    router.check()
            except (ValueError, EmbedderError) as e:
                if isinstance(e, ConfigError):
                    raise
                raise ConfigError(f"config '{cfg.name}'", "routing", str(e)) from e
