"""Runs one question's agent graph (a Session) in `pipelined` or `blocking` mode: every agent's
output streams into the session's APC; a successor is warmed incrementally (pipelined) or sent
whole once its precursors finished (blocking). The server calls `run_all` (whole graph) or
`run_agent` (one agent of a driver's fan-out).

Early-exit hook: after each precursor completes, `on_completion(session, successor, agent)` (if
set) returns the precursors of `successor` to drop; `drop_slots` removes them from its prompt
(re-warming from the longest valid prefix) and aborts those no other successor still reads. The
hook records its decisions in `Session.early_exit` and may skip a successor with `bypass`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from router.answer_cache import AnswerCache, PrecursorFailed
from router.config import TopologyConfig
from router.context import RouterContext
from router.incremental import WarmupLoop
from router.pd import PDCall, PrefillTarget
from router.successor_prompt import SuccessorPrompt, token_source
from router.template import TextSplicer, build_pieces, prompt_ids
from router.topology import layers, successors
from router.trace import AgentTrace, Clock
from sglang_ext import protocol as P

log = logging.getLogger(__name__)

Mode = Literal["pipelined", "blocking"]
MODES = ("pipelined", "blocking")
CompletionHook = Callable[["Session", str, str], Awaitable[list[str]]]


class UnknownAgent(ValueError):
    """A request names an agent the topology does not have."""


class AgentFailed(RuntimeError):
    """The final agent (or the agent a client asked for) failed; the message says why."""


@dataclass(slots=True)
class QuestionResult:
    session_id: str
    answer: str
    final_agent: str
    trace: dict[str, dict]
    early_exit: list[dict] = field(default_factory=list)


class Session:
    def __init__(
        self,
        ctx: RouterContext,
        cfg: TopologyConfig,
        question: str,
        mode: Mode,
        session_id: str | None = None,
        slot_orders: dict[str, list[str]] | None = None,
        on_completion: CompletionHook | None = None,
        question_id: str | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        ctx.check_served(cfg)
        self.ctx, self.cfg, self.question, self.mode = ctx, cfg, question, mode
        self.id = session_id or uuid.uuid4().hex
        self.slot_orders = slot_orders or {}
        self.on_completion = on_completion
        self.question_id = question_id
        # Early-exit decisions (Decision.to_record() dicts), in the order they were made.
        self.early_exit: list[dict] = []
        # Aggregator bypass: skipped successor -> the precursor whose output stands in for it.
        self.bypassed: dict[str, str] = {}
        self.clock = Clock()
        ids = [a.id for a in cfg.agents]
        self.apc = AnswerCache(ids)
        depth = layers(cfg)
        self.traces = {a.id: AgentTrace(model=a.model, layer=depth[a.id]) for a in cfg.agents}
        self.readers = successors(cfg)
        self.dropped: dict[str, set[str]] = {a: set() for a in ids}
        self.tasks: dict[str, asyncio.Task] = {}
        self._calls: dict[str, PDCall] = {}

    # --- running ------------------------------------------------------------------------------
    def start_agent(self, agent_id: str) -> asyncio.Task:
        """Start `agent_id` once; later calls return the same task."""
        if agent_id not in self.apc:
            raise UnknownAgent(
                f"agent '{agent_id}' is not in topology '{self.cfg.name}' "
                f"(agents: {', '.join(a.id for a in self.cfg.agents)})"
            )
        if agent_id not in self.tasks:
            self.tasks[agent_id] = asyncio.create_task(
                self._run(agent_id), name=f"{self.id}:{agent_id}"
            )
        return self.tasks[agent_id]

    async def run_all(self) -> QuestionResult:
        """Run every agent; return the final agent's answer and the trace."""
        try:
            for a in self.cfg.agents:
                self.start_agent(a.id)
            await asyncio.wait(self.tasks.values())
        finally:
            await self.close()
        final = self.apc[self.cfg.final]
        if not final.done:
            raise AgentFailed(final.error or f"final agent '{self.cfg.final}' was aborted")
        return QuestionResult(
            self.id, final.text, self.cfg.final, self.trace(), list(self.early_exit)
        )

    def trace(self) -> dict[str, dict]:
        # `skipped` is what activation_percentage reads: a bypassed successor ran no model.
        return {
            a: {**t.to_dict(), "bypassed": a in self.bypassed, "skipped": a in self.bypassed}
            for a, t in self.traces.items()
        }

    async def close(self) -> None:
        """Cancel what still runs (aborting its requests on the workers)."""
        pending = [t for t in self.tasks.values() if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending)

    def release(self) -> None:
        self.apc.release()

    # --- one agent ----------------------------------------------------------------------------
    async def _run(self, agent_id: str) -> None:
        trace = self.traces[agent_id]
        trace.start_s = self.clock.now()
        model = self.cfg.agent(agent_id).model
        dep = self.ctx.deployments[model]
        outcome = "error"
        try:
            body = {
                P.SAMPLING_PARAMS: self.cfg.sampling_of(agent_id).to_sglang(),
                P.RETURN_LOGPROB: True,
                P.RID: f"moa-{self.id[:12]}-{agent_id}-{uuid.uuid4().hex[:6]}",
            }
            if not self.cfg.precursors(agent_id):
                body[P.INPUT_IDS] = prompt_ids(
                    self.ctx.tokenizer(model), self.cfg.template_of(agent_id), self.question
                )
                await self._stream(agent_id, dep.via_router(body))
            else:
                target = dep.pick_prefill()
                trace.prefill_url = target.url
                try:
                    body[P.INPUT_IDS] = await self._successor_prompt(agent_id, target)
                    trace.final_request_s = self.clock.now()
                    await self._stream(agent_id, dep.dual(body, target))
                finally:
                    dep.unpin(target)
            self.apc.finish(agent_id)
            outcome = "ok"
        except asyncio.CancelledError:
            source = self.bypassed.get(agent_id)
            if source is None:
                trace.killed = True
                outcome = "killed"
                self.apc.kill(agent_id)
                raise
            # Cancelled on purpose by `bypass`: finish with the stand-in output instead.
            task = asyncio.current_task()
            while task.cancelling():
                task.uncancel()
            self._stand_in(agent_id, source)
            outcome = "bypassed"
        except Exception as e:  # noqa: BLE001 - any failure ends this agent, named in its error
            message = str(e) if isinstance(e, PrecursorFailed) else f"{type(e).__name__}: {e}"
            log.warning("session %s agent %s failed: %s", self.id, agent_id, message)
            trace.error = message
            self.apc.fail(agent_id, message)
        finally:
            trace.end_s = self.clock.now()
            answer = self.apc[agent_id]
            trace.output_ids, trace.text = list(answer.output_ids), answer.text
            self.ctx.metrics.agents.labels(model, outcome).inc()
            self.ctx.metrics.layer_latency.labels(str(trace.layer), self.mode).observe(trace.end_s)
        if outcome in ("ok", "bypassed"):
            await self._completed(agent_id)

    async def _successor_prompt(self, agent_id: str, target: PrefillTarget) -> list[int]:
        """The complete prompt: warmed on the way (pipelined) or built once all precursors
        ended (blocking). Both build it with the same SuccessorPrompt, so given the same slot
        order it is the same token list."""
        prompt = self._prompt_of(agent_id)
        trace = self.traces[agent_id]
        if self.mode == "pipelined" and self.cfg.incremental_prefill.enabled:
            model = self.cfg.agent(agent_id).model
            m = self.ctx.metrics

            def count(n_tokens: int, _meta: dict) -> None:
                m.warmups.labels(model).inc()
                m.warmup_tokens.labels(model).inc(n_tokens)

            loop = WarmupLoop(
                prompt,
                self.apc,
                self.ctx.deployments[model],
                target,
                self.cfg.incremental_prefill,
                trace,
                f"{P.WARMUP_RID_PREFIX}{self.id[:12]}-{agent_id}-",
                self.ctx.timeouts.precursor_wait_s,
                count,
            )
            ids = await loop.run()
        else:
            wait_s = self.ctx.timeouts.precursor_wait_s
            # Blocking: nothing goes out (and no dynamic slot is assigned) before every kept
            # precursor has ended.
            while not all(self.apc[p].ended for p in prompt.kept()):
                prompt.check_precursors()
                try:
                    await self.apc.wait_change(self.apc.version, wait_s)
                except TimeoutError as e:
                    raise TimeoutError(
                        f"agent '{agent_id}' waited {wait_s:g}s for its precursors {prompt.kept()}"
                    ) from e
            ids = prompt.state().ids
        trace.slot_order = list(prompt.order)
        return ids

    def _prompt_of(self, agent_id: str) -> SuccessorPrompt:
        model = self.cfg.agent(agent_id).model
        tok = self.ctx.tokenizer(model)
        pieces = build_pieces(tok, self.cfg.template_of(agent_id), self.question)
        sources = {}
        for p in pieces.slots:
            ptok = self.ctx.tokenizer(self.cfg.agent(p).model)
            if ptok.family == tok.family:
                sources[p] = token_source(tok.eot_ids)
            else:
                splicer = TextSplicer(tok)
                sources[p] = lambda a, s=splicer: s.ids(a.text, a.done)
        return SuccessorPrompt(
            agent_id,
            pieces,
            sources,
            self.apc,
            self.dropped[agent_id],
            dynamic=self.cfg.slot_order == "dynamic",
            forced_order=self.slot_orders.get(agent_id),
        )

    async def _stream(self, agent_id: str, call: PDCall) -> None:
        """Stream one generate call into the APC; abort it on the workers if cancelled."""
        trace = self.traces[agent_id]
        self._calls[agent_id] = call
        finished = False
        try:
            meta: dict = {}
            async for chunk in call.stream:
                ids = chunk.get(P.OUTPUT_IDS) or []
                meta = chunk.get(P.META_INFO) or {}
                lps = meta.get(P.OUTPUT_TOKEN_LOGPROBS) or []
                # Incremental or cumulative logprob lists: the tail matches the new ids.
                new_lps = [float(x[0]) for x in lps[len(lps) - len(ids) :]] if ids else []
                if ids and trace.first_token_s is None:
                    trace.first_token_s = self.clock.now()
                self.apc.append(agent_id, ids, new_lps, chunk.get(P.TEXT, self.apc[agent_id].text))
            finished = True
            trace.finish_reason = meta.get(P.FINISH_REASON)
            source = call.prefill_meta or meta
            trace.prompt_tokens = source.get(P.PROMPT_TOKENS)
            trace.cached_tokens = source.get(P.CACHED_TOKENS)
            if call.prefill_meta and trace.prompt_tokens:
                self.ctx.metrics.cached_ratio.labels(trace.model, self.mode).observe(
                    (trace.cached_tokens or 0) / trace.prompt_tokens
                )
        finally:
            del self._calls[agent_id]
            if not finished:
                await asyncio.shield(self.ctx.deployments[trace.model].abort(call))

    # --- early-exit hook ----------------------------------------------------------------------
    async def _completed(self, agent_id: str) -> None:
        if self.on_completion is None:
            return
        for succ in self.readers[agent_id]:
            drop = await self.on_completion(self, succ, agent_id)
            if drop:
                await self.drop_slots(succ, drop)

    async def bypass(self, successor: str, source: str) -> bool:
        """Skip `successor` (aggregator bypass): stop its run, aborting what it sent, and pass
        `source`'s output on as its output. False when it already ended or never started."""
        task = self.tasks.get(successor)
        if task is None or self.apc[successor].ended or successor in self.bypassed:
            return False
        self.bypassed[successor] = source
        await _cancel(task, until=lambda: self.apc[successor].done)
        return True

    def _stand_in(self, agent_id: str, source: str) -> None:
        src, answer = self.apc[source], self.apc[agent_id]
        # Whatever the stopped run streamed before the cancel is replaced, not extended.
        answer.output_ids, answer.logprobs = [], []
        self.apc.append(agent_id, list(src.output_ids), list(src.logprobs), src.text)
        self.apc.finish(agent_id)

    async def drop_slots(self, successor: str, agent_ids: list[str]) -> None:
        """Remove `agent_ids` from `successor`'s prompt; abort those nobody else still reads."""
        self.dropped[successor].update(agent_ids)
        self.apc.touch()
        for a in agent_ids:
            readers = self.readers[a]
            if all(a in self.dropped[r] for r in readers) and a in self.tasks:
                task = self.tasks[a]
                if not task.done():
                    await _cancel(task)


async def _cancel(task: asyncio.Task, until: Callable[[], bool] = lambda: False) -> None:
    """Cancel `task` and wait until it is done (or `until()` holds). Python 3.11's wait_for
    swallows a cancel that races its result, as when a warm-up loop was woken by the same APC
    change that triggered the early-exit decision: ask again until the task takes it."""
    while not task.done() and not until():
        task.cancel()
        await asyncio.wait([task], timeout=0.2)
