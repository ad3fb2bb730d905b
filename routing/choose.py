"""The routing choice, per question: rank the pool's candidates by performance × p − cost × cost
share − latency × latency share, where a candidate's cost and latency are those of the output
it is expected to write for this question (the scorer's length model; else its max_new_tokens),
as shares of the pool's largest possible (every candidate at its cap: a fixed scale, so a short
answer costs less on any question); then run the k best, or all whose p reaches the threshold,
at least `min_k` in either mode, and at most `max_per_model` candidates of one model (personas
of one model share its knowledge and its mistakes: a second one adds cost more than a view);
say why for each."""

from __future__ import annotations

from dataclasses import dataclass, field

from router.config import Routing
from routing.estimates import Estimate


@dataclass(slots=True)
class Candidate:
    id: str
    p: float  # the scorer's probability of a correct answer
    cost_share: float  # this question's cost ÷ the pool's largest possible
    latency_share: float  # this question's predicted latency ÷ the pool's slowest possible
    utility: float
    tokens: float = 0.0  # output tokens expected for this question
    rank: int = 0  # 1 = best utility
    chosen: bool = False
    reason: str = ""


@dataclass(slots=True)
class RoutingDecision:
    rule: str  # "k=2" or "threshold=0.5, min_k=1"
    candidates: list[Candidate]  # in rank order
    chosen: list[str] = field(default_factory=list)  # in pool order
    embed_s: float = 0.0  # the query's embedding
    wall_s: float = 0.0  # embedding + scoring + ranking

    def to_record(self) -> dict:
        return {
            "rule": self.rule,
            "chosen": list(self.chosen),
            "candidates": {
                c.id: {
                    "p": c.p,
                    "tokens": c.tokens,
                    "cost_share": c.cost_share,
                    "latency_share": c.latency_share,
                    "utility": c.utility,
                    "rank": c.rank,
                    "chosen": c.chosen,
                    "reason": c.reason,
                }
                for c in self.candidates
            },
            "embed_s": self.embed_s,
            "wall_s": self.wall_s,
        }


def _share(value: float | None, top: float) -> float:
    return value / top if value is not None and top > 0 else 0.0


def choose(
    p: dict[str, float],
    estimates: dict[str, Estimate],
    routing: Routing,
    pool_order: list[str],
    tokens: dict[str, float | None] | None = None,
) -> RoutingDecision:
    """Which of `pool_order` run for a question: `p` its candidates' probabilities, `tokens`
    their expected output tokens (None or missing: the cap). Ties in utility go to the earlier
    candidate of the pool."""
    missing = [c for c in pool_order if c not in p]
    if missing:
        raise ValueError(f"the scorer gave no probability for candidates {missing}")
    w = routing.weights
    top_cost = max(estimates[c].cost for c in pool_order)
    top_latency = max((estimates[c].latency_s or 0.0) for c in pool_order)
    cands = []
    for c in pool_order:
        n, cost, latency = estimates[c].for_tokens((tokens or {}).get(c))
        cs, ls = _share(cost, top_cost), _share(latency, top_latency)
        cands.append(
            Candidate(c, p[c], cs, ls, w.performance * p[c] - w.cost * cs - w.latency * ls, n)
        )
    ranked = sorted(cands, key=lambda c: -c.utility)  # stable: pool order breaks ties
    for i, c in enumerate(ranked, 1):
        c.rank = i
    cap = routing.max_per_model
    per_model: dict[str, int] = {}

    def take(c: Candidate, reason: str) -> None:
        c.chosen, c.reason = True, reason
        model = estimates[c.id].model
        per_model[model] = per_model.get(model, 0) + 1

    def capped(c: Candidate) -> bool:
        return cap is not None and per_model.get(estimates[c.id].model, 0) >= cap

    if routing.k is not None:  # the k best the per-model cap allows
        rule = f"k={routing.k}"
        for c in ranked:
            if sum(x.chosen for x in ranked) >= routing.k:
                c.reason = f"rank {c.rank} beyond k={routing.k}"
            elif capped(c):
                c.reason = f"rank {c.rank}, but {_cap_note(estimates, c, cap)}"
            else:
                take(c, f"rank {c.rank} within k={routing.k}")
    else:
        t = routing.threshold
        rule = f"threshold={t:g}"
        for c in ranked:
            if c.p < t:
                c.reason = f"p={c.p:.3f} below threshold {t:g}"
            elif capped(c):
                c.reason = (
                    f"p={c.p:.3f} reaches threshold {t:g}, but {_cap_note(estimates, c, cap)}"
                )
            else:
                take(c, f"p={c.p:.3f} reaches threshold {t:g}")
    rule += f", min_k={routing.min_k}" + (f", max_per_model={cap}" if cap is not None else "")
    # Top up to min_k, best utility first: within the per-model cap while it allows, then not.
    for within_cap in (True, False):
        for c in ranked:
            if sum(x.chosen for x in ranked) >= routing.min_k:
                break
            if not c.chosen and not (within_cap and capped(c)):
                take(c, f"{c.reason}; added (rank {c.rank}) to reach min_k={routing.min_k}")
    chosen = [c.id for c in cands if c.chosen]
    return RoutingDecision(rule, ranked, chosen)


def _cap_note(estimates: dict[str, Estimate], c: Candidate, cap: int) -> str:
    return f"its model '{estimates[c.id].model}' has {cap} chosen already (max_per_model)"
