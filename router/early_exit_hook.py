"""Early exit wired into a question's graph: the completion hook the orchestrator calls after each
precursor finishes. Per (question, cluster) it builds `AgentResult`s from the APC (logprobs) and
the embedder, calls `router.early_exit.decide`, records every decision in the session, and applies
aggregator bypass. `EarlyExitHooks` is the per-process factory `make_app` takes (cfg → hook).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from router.answers import extract_answer, has_answer
from router.config import TopologyConfig
from router.early_exit import AgentResult, Decision, SimilarityCache, decide
from router.embedder import EmbedderError
from router.majority_vote import bypass_choice, normalize_answer

if TYPE_CHECKING:
    from router.orchestrator import Session

log = logging.getLogger(__name__)

AnswerExtractor = Callable[[str], "str | None"]
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_answer(text: str) -> str | None:
    """The extractor of a question sent without its dataset: the last \\boxed{...}, else the last
    number, normalized. A question that names its dataset uses `dataset_extractor`."""
    found = BOXED.findall(text) or NUMBER.findall(text)
    return normalize_answer(found[-1]) if found else None


def dataset_extractor(dataset: str, task: str | None = None) -> AnswerExtractor:
    """`dataset`'s own extractor (router.answers, as its scoring uses), normalized for voting."""

    def extract(text: str) -> str | None:
        return normalize_answer(extract_answer(dataset, text, task))

    return extract


class EmbeddingService:
    """One embedding model of the router process, run on its own single worker thread (never on
    the event loop). `embed` returns the embedding and the seconds its computation took."""

    def __init__(self, embedder: Any) -> None:
        self._embedder = embedder
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ee-embed")
        self._preloaded = False

    def preload(self) -> None:
        """Queue the weights' loading now, so the first question's decoding hides it."""
        if not self._preloaded and hasattr(self._embedder, "load"):
            self._executor.submit(self._embedder.load)
        self._preloaded = True

    def _timed(self, text: str) -> tuple[np.ndarray, float]:
        # Timed on the worker thread: the model's compute only, not the wait in the queue
        # behind another agent's embedding (that wait overlaps decoding, it is not EE work).
        start = time.perf_counter()
        emb = self._embedder.embed(text)
        return emb, time.perf_counter() - start

    async def embed(self, text: str) -> tuple[np.ndarray, float]:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._timed, text)

    def check(self) -> None:
        """Load the model and run it once, here and now (raises EmbedderError)."""
        if hasattr(self._embedder, "check"):
            self._embedder.check()
        self._preloaded = True

    def width(self) -> int | None:
        """The embeddings' dimension, where the model says (after `check`)."""
        size = getattr(self._embedder, "hidden_size", None)
        return int(size) if size is not None else None

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _default_embedder(name: str) -> Any:
    from router.embedder import Embedder

    return Embedder(name)


class EarlyExitHooks:
    """Per router process: the embedders (created on first early-exit use, one per model name)
    and the answer extractor; calling it with a question's config gives that question's hook."""

    def __init__(
        self,
        answer_extractor: AnswerExtractor = last_answer,
        embedder_factory: Callable[[str], Any] = _default_embedder,
    ) -> None:
        self.answer_extractor = answer_extractor
        self._factory = embedder_factory
        self._services: dict[str, EmbeddingService] = {}
        self._unavailable: dict[str, str] = {}  # embedding model -> why it cannot load

    def embedding(self, model: str) -> EmbeddingService:
        if model not in self._services:
            self._services[model] = EmbeddingService(self._factory(model))
        return self._services[model]

    def check(self, configs: Iterable[TopologyConfig]) -> list[str]:
        """Load and run, now, the embedding model of every config that could need one (method q
        even when disabled: a request may turn early exit on). The router calls it at start-up,
        so a broken model fails `moa-pd up` with a message naming it and its directory, where a
        config enables early exit. Where none does, the router still serves blocking and
        pipelined questions (a GPU node without the embedding package, say): the returned
        warnings name what is missing, and a request that turns early exit on is refused."""
        warnings = []
        for cfg in configs:
            ee, bypass = cfg.early_exit, cfg.aggregator_bypass
            if ee.method == "q" or (bypass.enabled and bypass.criterion == "q"):
                try:
                    service = self.embedding(ee.embedding_model)
                    service.check()
                except (ValueError, EmbedderError) as e:
                    if ee.enabled or bypass.enabled:
                        raise EmbedderError(f"config '{cfg.name}': {e}") from e
                    self._unavailable[ee.embedding_model] = f"config '{cfg.name}': {e}"
                    self._services.pop(ee.embedding_model, None)
                    warnings.append(self._unavailable[ee.embedding_model])
        return warnings

    def __call__(
        self, cfg: TopologyConfig, dataset: str | None = None, task: str | None = None
    ) -> EarlyExitHook:
        """The hook of one question. With `dataset` (the runner sends it), DMV and aggregator
        bypass read answers with that dataset's own extractor, the one its scoring uses; a
        dataset whose outputs have no single answer is refused (ValueError) when the config
        votes on answers. Without it, the process-wide `answer_extractor`."""
        ee, bypass = cfg.early_exit, cfg.aggregator_bypass
        extractor = self.answer_extractor
        if dataset is not None:
            votes = (ee.enabled and ee.method == "dmv") or (
                bypass.enabled and bypass.criterion == "answer"
            )
            if votes and not has_answer(dataset):
                what = (
                    "early_exit.method 'dmv'"
                    if ee.enabled and ee.method == "dmv"
                    else ("aggregator_bypass.criterion 'answer'")
                )
                raise ValueError(
                    f"config '{cfg.name}' votes on extracted answers ({what}), but dataset "
                    f"'{dataset}' has no single answer to extract; use early_exit.method 'q' "
                    "(and aggregator_bypass.criterion 'q'), or run it without early exit"
                )
            extractor = dataset_extractor(dataset, task)
        needs = (ee.enabled and ee.method == "q") or (bypass.enabled and bypass.criterion == "q")
        if needs and ee.embedding_model in self._unavailable:
            raise ValueError(
                f"early exit is unavailable on this router: {self._unavailable[ee.embedding_model]}"
                "; run without early exit (settings #1-#3) or install the embedding model"
            )
        service = self.embedding(ee.embedding_model) if needs else None
        if service is not None:
            service.preload()
        return EarlyExitHook(cfg, service, extractor)

    def close(self) -> None:
        for s in self._services.values():
            s.close()


@dataclass(slots=True)
class ClusterState:
    """One successor's precursor set in one question."""

    planned: list[str]
    completed: list[AgentResult] = field(default_factory=list)
    cache: SimilarityCache = field(default_factory=SimilarityCache)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    killed: set[str] = field(default_factory=set)
    exited: bool = False
    settled: bool = False
    q: float | None = None  # Q of the latest method-q decision
    q_over: int = 0  # how many completed agents that Q covered


def _left(state: ClusterState) -> list[str]:
    """The cluster's agents neither completed nor cut."""
    done = {r.agent_id for r in state.completed}
    return [p for p in state.planned if p not in done and p not in state.killed]


class EarlyExitHook:
    """One question's hook: `await hook(session, successor, agent)` → precursors to drop."""

    def __init__(
        self,
        cfg: TopologyConfig,
        embeddings: EmbeddingService | None,
        answer_extractor: AnswerExtractor = last_answer,
    ) -> None:
        self.cfg = cfg
        self._embeddings = embeddings
        self._extract = answer_extractor
        self._clusters: dict[str, ClusterState] = {}
        # One embedding per agent output, shared by every cluster that reads the agent.
        self._embedded: dict[str, asyncio.Future] = {}
        self._charged: set[str] = set()

    async def __call__(self, session: Session, successor: str, agent_id: str) -> list[str]:
        """Decide for `successor` after `agent_id` completed. A failure (embedding, decision,
        bypass) propagates: the orchestrator fails the question with it, so a question asked to
        run with early exit never silently runs without it."""
        return await self._on_completion(session, successor, agent_id, time.perf_counter())

    def start_embedding(self, session: Session, agent_id: str) -> None:
        """Embed `agent_id`'s output in the background, from the moment it completes: the
        embedding runs while the cluster's other agents decode, and a decision awaits it only
        when it needs Q."""
        if self._embeddings is not None and agent_id not in self._embedded:
            text = session.apc[agent_id].text
            fut = asyncio.ensure_future(self._embeddings.embed(text))
            # Retrieved here so an embedding no decision needed fails quietly; one a decision
            # needs raises there (and fails the question).
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._embedded[agent_id] = fut

    def _may_need_embedding(self, session: Session, state: ClusterState, agent_id: str) -> bool:
        """Whether a decision of this cluster may still read `agent_id`'s embedding: not once
        the cluster exited or settled, and not for its last agent (no one is left to cut) unless
        aggregator bypass reads Q. Skipping those keeps early exit's CPU off the decoders."""
        if self._embeddings is None or state.settled or state.exited:
            return False
        b = self.cfg.aggregator_bypass
        if b.enabled and b.criterion == "q":
            return True
        return any(
            p != agent_id and p not in state.killed and not session.apc[p].ended
            for p in state.planned
        )

    async def _resolve_embeddings(self, session: Session, state: ClusterState) -> float:
        """Fill in the completed agents' embeddings (awaiting any still running, starting any
        not started); returns the compute seconds of those not charged to an earlier
        decision."""
        cost = 0.0
        for r in state.completed:
            if r.embedding is None:
                self.start_embedding(session, r.agent_id)
                r.embedding, emb_s = await asyncio.shield(self._embedded[r.agent_id])
                # EE overhead is honest: an output's embedding time is charged to the first
                # decision that uses it (once, even when several clusters read the agent).
                if r.agent_id not in self._charged:
                    self._charged.add(r.agent_id)
                    cost += emb_s
        return cost

    def _needs_q(self, state: ClusterState) -> bool:
        """Whether this completion's decision computes Q: not below min_completed (the
        embeddings go on in the background), not when nobody is left to cut."""
        ee = self.cfg.early_exit
        deciding = ee.enabled and ee.method == "q" and not state.exited
        return deciding and len(state.completed) >= ee.min_completed and bool(_left(state))

    async def _on_completion(
        self, session: Session, successor: str, agent_id: str, entered: float
    ) -> list[str]:
        ee, bypass = self.cfg.early_exit, self.cfg.aggregator_bypass
        if successor not in self._clusters:
            # The cluster is what runs: pool candidates routing left out are not planned.
            planned = [
                p
                for p in self.cfg.precursors(successor)
                if p not in getattr(session, "routed_out", ())
            ]
            self._clusters[successor] = ClusterState(planned)
        state = self._clusters[successor]
        # Started before waiting for the cluster: the embedding runs while the others decode.
        if self._may_need_embedding(session, state, agent_id):
            self.start_embedding(session, agent_id)
        async with state.lock:  # decisions of one cluster in completion order
            # A successor that ended (killed by its own cluster's exit, or bypassed) decides no more.
            if state.settled or agent_id in state.killed or session.apc[successor].ended:
                return []
            start = time.perf_counter()
            answer = session.apc[agent_id]
            needs_answer = (ee.enabled and ee.method == "dmv") or (
                bypass.enabled and bypass.criterion == "answer"
            )
            extracted = self._extract(answer.text) if needs_answer else None
            cost = time.perf_counter() - start
            state.completed.append(AgentResult(agent_id, list(answer.logprobs), None, extracted))
            if self._needs_q(state):
                cost += await self._resolve_embeddings(session, state)
            drop: list[str] = []
            if ee.enabled and not state.exited:
                drop = self._decide(session, successor, state, cost, entered)
            done = {r.agent_id for r in state.completed}
            state.settled = all(p in done or p in state.killed for p in state.planned)
            # Bypass before the drop: the successor's prompt is not complete yet, so its final
            # request never goes out.
            if state.settled and bypass.enabled and bypass.criterion == "q":
                await self._resolve_embeddings(session, state)
            if state.settled and bypass.enabled:
                await self._bypass(session, successor, state)
            if drop:
                await self._drop(session, successor, drop)
            return drop

    def _decide(
        self, session: Session, successor: str, state: ClusterState, cost: float, entered: float
    ) -> list[str]:
        ee = self.cfg.early_exit
        # Draws keyed by (seed, question id or text, cluster, ℓ): the same question replays.
        key = session.question_id or session.question
        if ee.method == "q" and not _left(state):
            # Nobody is left to cut: nothing to decide (bypass computes its own Q if it needs).
            d = Decision(successor, [r.agent_id for r in state.completed])
        else:
            d = decide(successor, state.completed, state.planned, ee, key, state.cache)
        if ee.method == "q" and d.q is not None:
            state.q, state.q_over = d.q, len(state.completed)
        # An agent that finished while this decision ran keeps its slot: its work is done.
        d.killed = [a for a in d.killed if not session.apc[a].done]
        if d.exited and not d.killed:
            # Every other agent had already finished: an exit that cuts nothing is no exit.
            d.exited, d.moot = False, True
        d.seconds += cost
        d.wall_s = time.perf_counter() - entered
        session.early_exit.append(d.to_record())
        if d.moot:
            state.exited = True  # the draw said exit; later completions decide no more
        if not d.exited:
            return []
        state.exited = True
        state.killed.update(d.killed)
        return d.killed

    async def _drop(self, session: Session, successor: str, killed: list[str]) -> None:
        """Drop `killed` now, then whatever only they still read (a killed aggregator's unfinished
        precursors): nothing in the graph would use those outputs."""
        await session.drop_slots(successor, killed)
        for k in killed:
            upstream = [p for p in self.cfg.precursors(k) if not session.apc[p].ended]
            if upstream:
                await self._drop(session, k, upstream)

    async def _bypass(self, session: Session, successor: str, state: ClusterState) -> None:
        b, ee = self.cfg.aggregator_bypass, self.cfg.early_exit
        q = state.q
        if b.criterion == "q" and state.q_over != len(state.completed):
            q_cfg = ee.model_copy(update={"method": "q", "min_completed": 1})
            key = session.question_id or session.question
            q = decide(successor, state.completed, state.planned, q_cfg, key, state.cache).q
        choice = bypass_choice(
            [r.agent_id for r in state.completed],
            [r.answer for r in state.completed],
            [r.confidence for r in state.completed],
            b.criterion,
            q,
            b.q_threshold,
        )
        if choice is not None:
            await session.bypass(successor, choice)
