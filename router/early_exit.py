"""Dynamic early exit inside a cluster (paper §4.2, Algorithm 1): confidence, Frobenius cosine
similarity of token-embedding correlation matrices, the Q score, the seeded draw, and `decide`,
which the orchestrator calls at every completion inside a cluster. numpy only, no torch.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from router.config import EarlyExit
from router.majority_vote import vote

# Feature columns with a norm below this are treated as all-zero (their correlations are 0).
EPS = 1e-12
# exited: the exit cut at least one agent. moot: the draw said exit but every other agent had
# already finished (nothing cut; not an exit). seconds: the decision's compute, each output's
# embedding charged once. wall_s: from the triggering completion to the decision applied (for an
# exit, the delay it put on the successor's final request).
RECORD_KEYS = (
    "cluster",
    "completed",
    "c_bar",
    "p",
    "b",
    "q",
    "u",
    "exited",
    "moot",
    "killed",
    "seconds",
    "wall_s",
)


@dataclass(slots=True)
class AgentResult:
    """One completed agent of a cluster, as early exit sees it."""

    agent_id: str
    logprobs: Sequence[float]  # the generated tokens' logprobs, as streamed
    embedding: np.ndarray | None = None  # T_i [n_i, h]: per-token last hidden states of the text
    answer: str | None = None  # the dataset extractor's final answer (DMV, aggregator bypass)

    @property
    def confidence(self) -> float:
        return confidence(self.logprobs)


@dataclass(slots=True)
class Decision:
    cluster: str
    completed: list[str]
    c_bar: float | None = None
    p: float | None = None
    b: float | None = None
    # method q: the exit probability Q. method dmv: the share of planned agents that agree.
    q: float | None = None
    u: float | None = None
    exited: bool = False
    moot: bool = False
    killed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    wall_s: float = 0.0

    def to_record(self) -> dict:
        """The trace/results row form: exactly RECORD_KEYS."""
        return {k: getattr(self, k) for k in RECORD_KEYS}


def confidence(logprobs: Sequence[float]) -> float:
    """C = exp(mean token logprob), the geometric mean of the token probabilities.

    An output without tokens has no evidence of confidence: 0.
    """
    if len(logprobs) == 0:
        return 0.0
    return float(np.exp(np.mean(np.asarray(logprobs, dtype=np.float64))))


def aggregate_confidence(confidences: Sequence[float]) -> float:
    """C̄ = root mean square of the per-agent confidences."""
    c = np.asarray(confidences, dtype=np.float64)
    return float(np.sqrt(np.mean(c * c))) if c.size else 0.0


def unit_columns(embedding: np.ndarray) -> np.ndarray:
    """S = T with each feature column scaled to unit norm (float64), so Corr(TᵀT) = SᵀS."""
    t = np.asarray(embedding, dtype=np.float64)
    if t.ndim != 2:
        raise ValueError(f"an embedding must be [n_tokens, hidden], got shape {t.shape}")
    norms = np.sqrt(np.einsum("nh,nh->h", t, t))
    return t / np.maximum(norms, EPS)


def fcs(s_i: np.ndarray, s_j: np.ndarray, norm_i: float, norm_j: float) -> float:
    """Frobenius cosine similarity of Corr(U_i), Corr(U_j) from unit-column S (n×n products only).

    ⟨SᵢᵀSᵢ, SⱼᵀSⱼ⟩_F = ‖Sᵢ Sⱼᵀ‖_F², and ‖SᵢᵀSᵢ‖_F = ‖Sᵢ Sᵢᵀ‖_F; never forms the h×h matrices.
    """
    if norm_i <= 0.0 or norm_j <= 0.0:
        return 0.0
    cross = s_i @ s_j.T
    # Clip: both matrices are PSD so the true value lies in [0, 1]; rounding may overshoot.
    return float(min(1.0, max(0.0, np.vdot(cross, cross) / (norm_i * norm_j))))


def self_norm(s: np.ndarray) -> float:
    """‖Corr(U)‖_F = ‖S Sᵀ‖_F."""
    return float(np.linalg.norm(s @ s.T))


class SimilarityCache:
    """Per-cluster memo of S_i, ‖Corr(U_i)‖_F and pairwise FCS, so the decision at the ℓ-th
    completion only computes the ℓ−1 new pairs. One instance per (question, cluster)."""

    def __init__(self) -> None:
        self._features: dict[str, tuple[np.ndarray, float]] = {}
        self._pairs: dict[tuple[str, str], float] = {}

    def features(self, agent: AgentResult) -> tuple[np.ndarray, float]:
        if agent.agent_id not in self._features:
            if agent.embedding is None:
                raise ValueError(
                    f"agent {agent.agent_id} has no embedding; embed its output text "
                    "(router.embedder.Embedder) before calling decide with method 'q'"
                )
            s = unit_columns(agent.embedding)
            self._features[agent.agent_id] = (s, self_norm(s))
        return self._features[agent.agent_id]

    def similarity(self, a: AgentResult, b: AgentResult) -> float:
        if a.agent_id == b.agent_id:
            return 1.0 if self.features(a)[1] > 0.0 else 0.0
        key = tuple(sorted((a.agent_id, b.agent_id)))
        if key not in self._pairs:
            (s_a, n_a), (s_b, n_b) = self.features(a), self.features(b)
            self._pairs[key] = fcs(s_a, s_b, n_a, n_b)
        return self._pairs[key]


def agreement(
    agents: Sequence[AgentResult],
    include_diagonal: bool = True,
    cache: SimilarityCache | None = None,
) -> float:
    """P = Σ_{j≤i} CᵢCⱼ·Sim[i,j] / Σ_{j≤i} CᵢCⱼ (j<i without the diagonal); 0 with no weight."""
    cache = cache or SimilarityCache()
    conf = [a.confidence for a in agents]
    num = den = 0.0
    for i in range(len(agents)):
        for j in range(i + 1 if include_diagonal else i):
            w = conf[i] * conf[j]
            num += w * cache.similarity(agents[i], agents[j])
            den += w
    return num / den if den > 0.0 else 0.0


def calibration(p: float, tau: float) -> float:
    """B = 1 − |P − τ|/τ, clipped at 0 (with τ < 0.5 and P near 1 it would go negative)."""
    return max(0.0, 1.0 - abs(p - tau) / tau)


def q_score(c_bar: float, b: float, tau: float, exponent: str = "tau") -> float:
    """Q = (sqrt(C̄·B))^e, e = τ (algorithm box), 1 ("none", the prose) or 1/τ."""
    powers = {"tau": tau, "none": 1.0, "inverse_tau": 1.0 / tau}
    if exponent not in powers:
        raise ValueError(f"unknown exponent form {exponent!r}; use one of {sorted(powers)}")
    return math.sqrt(max(0.0, c_bar * b)) ** powers[exponent]


def draw(seed: int, question: str, cluster: str, n_completed: int) -> float:
    """u ~ U(0,1), a pure function of (seed, question, cluster, ℓ): stable across processes
    (sha256, not Python's salted hash()), so a run replays the same exits."""
    key = f"{seed}\x1f{question}\x1f{cluster}\x1f{n_completed}".encode()
    digest = int.from_bytes(hashlib.sha256(key).digest()[:16], "little")
    return float(np.random.default_rng(digest).random())


def decide(
    cluster_id: str,
    completed: Sequence[AgentResult],
    planned: Sequence[str],
    cfg: EarlyExit,
    draw_key: str,
    cache: SimilarityCache | None = None,
) -> Decision:
    """Whether cluster `cluster_id` (its successor's id) exits now, after `completed` finished.

    `planned` lists every agent of the cluster; on exit the ones not completed are `killed`.
    `draw_key` names the question (or session), combined with cfg.seed for the draw. The caller
    checks cfg.enabled. Q is computed even when nothing is left to kill, so aggregator bypass can
    read it; below cfg.min_completed nothing is computed and nothing exits.
    """
    start = time.perf_counter()
    done = [a.agent_id for a in completed]
    unknown = set(done) - set(planned)
    if unknown:
        raise ValueError(f"completed agents {sorted(unknown)} are not in cluster {cluster_id}")
    decision = Decision(cluster=cluster_id, completed=done)
    remaining = [a for a in planned if a not in set(done)]
    if len(completed) >= cfg.min_completed:
        if cfg.method == "dmv":
            tally = vote([a.answer for a in completed], len(planned))
            decision.q = tally.share
            decision.exited = bool(remaining) and tally.majority
        else:
            decision.c_bar = aggregate_confidence([a.confidence for a in completed])
            decision.p = agreement(completed, cfg.include_diagonal, cache)
            decision.b = calibration(decision.p, cfg.tau)
            decision.q = q_score(decision.c_bar, decision.b, cfg.tau, cfg.exponent)
            decision.u = draw(cfg.seed, draw_key, cluster_id, len(completed))
            decision.exited = bool(remaining) and decision.u < decision.q
    if decision.exited:
        decision.killed = remaining
    decision.seconds = decision.wall_s = time.perf_counter() - start
    return decision


def activation_percentage(
    traces: Sequence[dict], agent_models: dict[str, str] | None = None
) -> dict[str, float]:
    """Per-model activation % = 100 · runs that completed and were not killed / runs planned.

    The paper's invoked_times / total_samples: every agent of a cluster starts at once, so
    "started" would always be 100%; an agent counts as invoked when its output was used, i.e. it
    ran to completion and early exit did not kill it (trace entry `killed` false; an entry with
    `skipped` true, or no entry at all, as for a bypassed successor, is not invoked). Runs
    planned = samples × that model's agents, the agents taken from `agent_models` (agent id →
    model, from the config) or else from the union of the traces' entries.
    """
    if agent_models is None:
        agent_models = {aid: e["model"] for t in traces for aid, e in t.items()}
    slots: dict[str, int] = {}
    for model in agent_models.values():
        slots[model] = slots.get(model, 0) + 1
    invoked = dict.fromkeys(slots, 0)
    for trace in traces:
        for aid, model in agent_models.items():
            entry = trace.get(aid)
            if entry is not None and not entry.get("killed") and not entry.get("skipped"):
                invoked[model] += 1
    n = len(traces)
    return {m: 100.0 * invoked[m] / (n * slots[m]) if n else 0.0 for m in slots}
