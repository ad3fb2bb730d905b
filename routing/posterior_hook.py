"""Posterior correction wired into a question: `PosteriorHook(session, successor, answers)`
embeds the answers (or reuses the early-exit hook's embeddings of them), takes the scorer's
priors from the question's routing decision and scores them (routing/posterior.py)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from router.config import PosteriorCorrection
from router.early_exit import AgentResult
from routing.posterior import PosteriorDecision, correct

if TYPE_CHECKING:
    from router.early_exit_hook import EmbeddingService
    from router.orchestrator import Session


class PosteriorHook:
    def __init__(self, cfg: PosteriorCorrection, embeddings: EmbeddingService) -> None:
        self.cfg = cfg
        self._embeddings = embeddings

    async def _embedding(self, session: Session, agent_id: str):
        shared = getattr(session.on_completion, "_embedded", {}).get(agent_id)
        if shared is not None:  # the early-exit hook embedded it already (or is doing so)
            emb, _ = await asyncio.shield(shared)
            return emb, 0.0
        return await self._embeddings.embed(session.apc[agent_id].text)

    async def __call__(
        self, session: Session, successor: str, answers: list[str]
    ) -> PosteriorDecision:
        start = time.perf_counter()
        results = []
        for a in answers:
            emb = None
            if self.cfg.agreement_weight > 0 and len(answers) > 1:
                emb, _ = await self._embedding(session, a)
            results.append(AgentResult(a, list(session.apc[a].logprobs), emb))
        routing = session.routing or {}
        priors = {c: v["p"] for c, v in routing.get("candidates", {}).items()}
        decision = correct(successor, results, priors, self.cfg)
        decision.seconds = time.perf_counter() - start
        return decision
