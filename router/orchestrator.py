"""Runs one question's agent graph (a Session) in `pipelined`, `blocking` or `blocking_layer`
mode: every agent's output streams into the session's APC; a successor is warmed incrementally
(pipelined), sent whole once its precursors finished (blocking), or sent whole once every agent
of the layers before its own ended (blocking_layer: the paper's baseline, "conventional,
blocking, layer-by-layer orchestration"); agent_runner.py sends each agent's requests. The
server calls `run_all` (whole graph) or `start_agent` (one agent of a driver's fan-out).

Early-exit hook: after each precursor completes, `on_completion(session, successor, agent)` (if
set) returns the precursors of `successor` to drop; `drop_slots` removes them from its prompt
(re-warming from the longest valid prefix) and aborts those no other successor still reads. The
hook records its decisions in `Session.early_exit` and may skip a successor with `bypass`. A
hook that raises fails the session (`run_all` raises AgentFailed naming it).

Routing (a config with a pool and routing): `route(session)` decides, before any agent starts,
which pool candidates run; the others never start and are dropped from every prompt that reads
them. `posterior(session, successor, answers)` (posterior correction) scores the chosen answers
once they all ended, while the successor's prompt is held (PromptGate); low ones are dropped or
ordered last. Both are recorded in `Session.routing` and `Session.posterior`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from router.agent_runner import AgentJob, AgentRunner
from router.answer_cache import AnswerCache, PrecursorFailed
from router.config import TopologyConfig
from router.context import RouterContext
from router.priority import start_order
from router.sglang_client import WorkerError
from router.successor_prompt import PromptGate
from router.topology import layers, successors
from router.trace import AgentTrace, Clock

if TYPE_CHECKING:
    from routing.choose import RoutingDecision
    from routing.posterior import PosteriorDecision

log = logging.getLogger(__name__)

Mode = Literal["pipelined", "blocking", "blocking_layer"]
MODES = ("pipelined", "blocking", "blocking_layer")
CompletionHook = Callable[["Session", str, str], Awaitable[list[str]]]
RouteHook = Callable[["Session"], Awaitable["RoutingDecision"]]
PosteriorHook = Callable[["Session", str, list[str]], Awaitable["PosteriorDecision"]]


class UnknownAgent(ValueError):
    """A request names an agent the topology does not have."""


class AgentFailed(RuntimeError):
    """The final agent (or the agent a client asked for) failed; the message says why. `status`:
    400 when a worker refused a request of the question as invalid (the client's to fix), else
    502."""

    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class QuestionResult:
    session_id: str
    answer: str
    final_agent: str
    trace: dict[str, dict]
    early_exit: list[dict] = field(default_factory=list)
    routing: dict | None = None
    posterior: list[dict] = field(default_factory=list)


class Session:
    """One question's graph run: its APC, agent tasks, traces and early-exit state."""

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
        route: RouteHook | None = None,
        posterior: PosteriorHook | None = None,
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
        depth = self.depth = layers(cfg)
        self.traces = {a.id: AgentTrace(model=a.model, layer=depth[a.id]) for a in cfg.agents}
        self.readers = successors(cfg)
        self.dropped: dict[str, set[str]] = {a: set() for a in ids}
        self.tasks: dict[str, asyncio.Task] = {}
        # Part of every rid: unique per Session even when a client reuses a session id.
        self.rid_tag = uuid.uuid4().hex[:12]
        # Its arrival at this router: ranks its requests under workflow priority.
        self.arrival = ctx.order.next_question()
        # Per-agent endpoint: clients streaming each agent now (a disconnect cancels an agent
        # only when nobody else needs it).
        self.followers: Counter[str] = Counter()
        # Set when the session as a whole failed (not one agent): run_all raises it.
        self.failure: str | None = None
        # Agents whose request a worker refused as invalid (a 4xx): the question's fault.
        self.refused: set[str] = set()
        # Routing: pool candidates this question does not run; the decision and corrections.
        self.route, self.posterior_hook = route, posterior
        self.routed_out: set[str] = set()
        self._correcting: set[str] = set()
        self.routing: dict | None = None
        self.posterior: list[dict] = []
        pool = set(cfg.pool_ids)
        self.gates: dict[str, PromptGate] = (
            {a: PromptGate() for a in ids if pool & set(cfg.precursors(a))}
            if posterior is not None
            else {}
        )

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
        """Run every agent; return the final agent's answer and the trace. A process of one of
        its models going down fails the question at once (never a result from a half-dead
        deployment)."""
        models = {a.model for a in self.cfg.agents}
        started = time.monotonic()

        def on_down(endpoint) -> None:
            if endpoint.model in models:
                self._fail(endpoint.describe())

        unwatch = self.ctx.health.watch(on_down)
        try:
            if self.route is not None:
                await self._route()
            order = start_order(
                self.cfg, self.ctx.order.critical_path_first, self.on_completion is not None
            )
            for index, agent_id in enumerate(order):
                self.traces[agent_id].start_index = index
                if agent_id not in self.routed_out:
                    self.start_agent(agent_id)
            await asyncio.wait(self.tasks.values())
        finally:
            unwatch()
            await self.close()
        if self.failure is None and (down := self.ctx.health.down_since(models, started)):
            self._fail("; ".join(e.describe() for e in down))
        for t in self.tasks.values():
            # `_run` handles its own failures: an exception here is a bug; retrieve and report it.
            if not t.cancelled() and (e := t.exception()) is not None:
                self._fail(f"agent task {t.get_name()} crashed: {type(e).__name__}: {e}")
        if self.failure is not None:
            raise AgentFailed(self.failure)
        final = self.apc[self.cfg.final]
        if not final.done:
            raise AgentFailed(
                final.error or f"final agent '{self.cfg.final}' was aborted", self.error_status
            )
        return QuestionResult(
            self.id,
            final.text,
            self.cfg.final,
            self.trace(),
            list(self.early_exit),
            self.routing,
            list(self.posterior),
        )

    async def _route(self) -> None:
        """Choose this question's pool candidates; drop the others from every prompt."""
        try:
            decision = await self.route(self)
        except Exception as e:
            log.exception("session %s: routing failed", self.id)
            raise AgentFailed(f"routing failed: {type(e).__name__}: {e}") from e
        self.routing = decision.to_record()
        self.routed_out = set(self.cfg.pool_ids) - set(decision.chosen)
        for a in self.routed_out:
            self.traces[a].routed_out = True
            for r in self.readers[a]:
                self.dropped[r].add(a)

    @property
    def error_status(self) -> int:
        """The HTTP status of a failed question: 400 when a worker refused one of its requests
        as invalid, else 502."""
        return 400 if self.refused and self.failure is None else 502

    def trace(self) -> dict[str, dict]:
        # `skipped` is what activation_percentage reads: a bypassed successor ran no model, nor
        # did a candidate routing left out.
        return {
            a: {
                **t.to_dict(),
                "bypassed": a in self.bypassed,
                "skipped": a in self.bypassed or a in self.routed_out,
            }
            for a, t in self.traces.items()
        }

    def still_needed(self, agent_id: str) -> bool:
        """Whether another client follows `agent_id`, or a successor that has not ended (running
        or still to be requested) reads its output."""
        if self.followers[agent_id] > 0:
            return True
        return any(
            agent_id not in self.dropped[r] and not self.apc[r].ended
            for r in self.readers[agent_id]
        )

    async def close(self) -> None:
        """Cancel what still runs (aborting its requests on the workers)."""
        pending = [t for t in self.tasks.values() if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending)

    def release(self) -> None:
        """The session ended: record per-layer latency, drop the APC. Runs once."""
        if not self.apc.released:
            self.ctx.metrics.observe_layers(list(self.traces.values()), self.mode)
            self.apc.release()

    def _fail(self, message: str) -> None:
        """Fail the whole session (not one agent): stop every agent; `run_all` raises it."""
        if self.failure is None:
            self.failure = message
        me = asyncio.current_task()
        for t in self.tasks.values():
            if t is not me and not t.done():
                t.cancel()

    # --- one agent ----------------------------------------------------------------------------
    def _job(self, agent_id: str) -> AgentJob:
        return AgentJob(
            agent_id=agent_id,
            cfg=self.cfg,
            question=self.question,
            mode=self.mode,
            layer_barrier=self._layer_barrier(agent_id),
            apc=self.apc,
            trace=self.traces[agent_id],
            clock=self.clock,
            dropped=self.dropped[agent_id],
            forced_order=self.slot_orders.get(agent_id),
            rid_tag=self.rid_tag,
            arrival=self.arrival,
            gate=self.gates.get(agent_id),
        )

    def _layer_barrier(self, agent_id: str) -> list[str]:
        """blocking_layer: every agent of the layers before `agent_id`'s, which must all have
        ended (done, failed, or killed by early exit) before its final request goes out."""
        if self.mode != "blocking_layer":
            return []
        mine = self.depth[agent_id]
        return [a for a, d in self.depth.items() if d < mine and a not in self.routed_out]

    async def _run(self, agent_id: str) -> None:
        trace = self.traces[agent_id]
        trace.start_s = self.clock.now()
        outcome = "error"
        try:
            await AgentRunner(self._job(agent_id), self.ctx).run()
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
            where = ""
            if isinstance(e, WorkerError):
                # The client reads the agent and the cause; the worker's URL goes to the log only.
                what = str(e)
                if e.refused:
                    self.refused.add(agent_id)
                    what = f"the worker refused its {e.stage} request (HTTP {e.status}): {e.reason}"
                message = f"agent '{agent_id}' (model {trace.model}): {what}"
                where = f" ({e.url})"
            log.warning("session %s agent %s failed: %s%s", self.id, agent_id, message, where)
            trace.error = message
            self.apc.fail(agent_id, message)
        finally:
            trace.end_s = self.clock.now()
            answer = self.apc[agent_id]
            trace.output_ids, trace.text = list(answer.output_ids), answer.text
            self.ctx.metrics.agents.labels(trace.model, outcome).inc()
        if outcome in ("ok", "bypassed"):
            await self._completed(agent_id)

    # --- early-exit hook ----------------------------------------------------------------------
    async def _completed(self, agent_id: str) -> None:
        await self._early_exit(agent_id)
        for succ in self.readers[agent_id]:
            if succ in self.gates and self.failure is None:
                await self._correct(succ)

    async def _correct(self, successor: str) -> None:
        """Posterior correction of `successor`'s answers once every kept one ended; then its
        prompt is released (low answers dropped or ordered last)."""
        gate = self.gates[successor]
        kept = [p for p in self.cfg.precursors(successor) if p not in self.dropped[successor]]
        if gate.is_open or successor in self._correcting or self.apc[successor].ended:
            return
        if not all(self.apc[p].ended for p in kept):
            return
        self._correcting.add(successor)
        answers = [p for p in kept if self.apc[p].done]
        held = self.clock.now()
        try:
            decision = await self.posterior_hook(self, successor, answers)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a failing correction must not vanish in a task
            log.exception("session %s: posterior correction failed at %s", self.id, successor)
            self._fail(f"posterior correction for '{successor}' failed: {type(e).__name__}: {e}")
            return
        decision.wall_s = self.clock.now() - held
        self.posterior.append(decision.to_record())
        if decision.action == "drop" and decision.low:
            self.dropped[successor].update(decision.low)
            gate.release([])
        else:
            gate.release(decision.low)
        self.apc.touch()

    async def _early_exit(self, agent_id: str) -> None:
        if self.on_completion is None:
            return
        for succ in self.readers[agent_id]:
            try:
                drop = await self.on_completion(self, succ, agent_id)
                if drop:
                    await self.drop_slots(succ, drop)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a failing hook must not vanish in a task
                log.exception(
                    "session %s: early-exit hook failed at %s/%s", self.id, succ, agent_id
                )
                self._fail(
                    f"early exit failed after agent '{agent_id}' completed (deciding for "
                    f"'{succ}'): {type(e).__name__}: {e}"
                )
                return

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
