"""Posterior correction (RouteMoA's judges, without extra inference): once a successor's chosen
proposers answered, score each answer from the scorer's prior, its own confidence (exp of its
mean token logprob, the Q-metric's C) and its agreement with the others (mean Frobenius cosine
similarity of the early-exit token embeddings); answers below `relative_cutoff` × the best are
low: dropped from the successor's prompt or ordered last."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from router.config import PosteriorCorrection
from router.early_exit import AgentResult, SimilarityCache


@dataclass(slots=True)
class PosteriorDecision:
    cluster: str  # the successor whose prompt it orders
    action: str  # "drop" or "last"
    scores: dict[str, dict[str, float | None]]  # id -> prior, confidence, agreement, score
    low: list[str] = field(default_factory=list)  # worst first
    seconds: float = 0.0  # the embeddings and the scoring
    wall_s: float = 0.0  # the successor's prompt was held this long

    def to_record(self) -> dict:
        return {
            "cluster": self.cluster,
            "action": self.action,
            "scores": self.scores,
            "low": list(self.low),
            "seconds": self.seconds,
            "wall_s": self.wall_s,
        }


def _agreement(i: int, answers: Sequence[AgentResult], cache: SimilarityCache) -> float | None:
    others = [cache.similarity(answers[i], b) for j, b in enumerate(answers) if j != i]
    if not others:
        return None
    return min(1.0, max(0.0, sum(others) / len(others)))


def correct(
    cluster: str,
    answers: Sequence[AgentResult],
    priors: dict[str, float],
    cfg: PosteriorCorrection,
    cache: SimilarityCache | None = None,
) -> PosteriorDecision:
    """Score `answers` (with embeddings where agreement is weighed) and name the low ones. An
    input without evidence (no prior, a lone answer's agreement) leaves its weight out."""
    start = time.perf_counter()
    cache = cache or SimilarityCache()
    scores: dict[str, dict[str, float | None]] = {}
    for i, a in enumerate(answers):
        parts = {
            "prior": priors.get(a.agent_id),
            "confidence": a.confidence,
            "agreement": _agreement(i, answers, cache) if cfg.agreement_weight > 0 else None,
        }
        weights = {
            "prior": cfg.prior_weight,
            "confidence": cfg.confidence_weight,
            "agreement": cfg.agreement_weight,
        }
        used = {k: w for k, w in weights.items() if parts[k] is not None and w > 0}
        total = sum(used.values())
        score = sum(w * parts[k] for k, w in used.items()) / total if total > 0 else 0.0
        scores[a.agent_id] = {**parts, "score": score}
    best = max((s["score"] for s in scores.values()), default=0.0)
    low = [a for a, s in scores.items() if s["score"] < cfg.relative_cutoff * best]
    low.sort(key=lambda a: scores[a]["score"])
    return PosteriorDecision(cluster, cfg.action, scores, low, time.perf_counter() - start)
