"""The routing choice: rank the pool's candidates by performance × p − cost × cost share −
latency × latency share (weights from the config; shares of the pool's largest), run the k
best, or all whose predicted p reaches the threshold, at least `min_k`; say why for each."""

from __future__ import annotations

from dataclasses import dataclass, field

from router.config import Routing
from routing.estimates import Estimate


@dataclass(slots=True)
class Candidate:
    id: str
    p: float  # the scorer's probability of a correct answer
    cost_share: float  # cost ÷ the pool's largest
    latency_share: float  # predicted latency ÷ the pool's slowest (0 when not weighed)
    utility: float
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


def _shares(values: dict[str, float | None]) -> dict[str, float]:
    top = max((v for v in values.values() if v is not None), default=0.0)
    return {k: (v / top if v is not None and top > 0 else 0.0) for k, v in values.items()}


def choose(
    p: dict[str, float], estimates: dict[str, Estimate], routing: Routing, pool_order: list[str]
) -> RoutingDecision:
    """Which of `pool_order` run. Ties in utility go to the earlier candidate of the pool."""
    missing = [c for c in pool_order if c not in p]
    if missing:
        raise ValueError(f"the scorer gave no probability for candidates {missing}")
    w = routing.weights
    cost = _shares({c: estimates[c].cost for c in pool_order})
    lat = _shares({c: estimates[c].latency_s for c in pool_order})
    cands = [
        Candidate(
            c, p[c], cost[c], lat[c], w.performance * p[c] - w.cost * cost[c] - w.latency * lat[c]
        )
        for c in pool_order
    ]
    ranked = sorted(cands, key=lambda c: -c.utility)  # stable: pool order breaks ties
    for i, c in enumerate(ranked, 1):
        c.rank = i
    if routing.k is not None:
        rule = f"k={routing.k}"
        for c in ranked:
            c.chosen = c.rank <= routing.k
            c.reason = f"rank {c.rank} {'within' if c.chosen else 'beyond'} k={routing.k}"
    else:
        t, m = routing.threshold, routing.min_k
        rule = f"threshold={t:g}, min_k={m}"
        for c in ranked:
            c.chosen = c.p >= t
            c.reason = f"p={c.p:.3f} {'reaches' if c.chosen else 'below'} threshold {t:g}"
        for c in ranked:  # top up, best utility first, to min_k
            if sum(x.chosen for x in ranked) >= m:
                break
            if not c.chosen:
                c.chosen = True
                c.reason += f"; added (rank {c.rank}) to reach min_k={m}"
    chosen = [c.id for c in cands if c.chosen]
    return RoutingDecision(rule, ranked, chosen)
