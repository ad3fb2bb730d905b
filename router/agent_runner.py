"""One agent's requests within a session: its prompt (a first-layer template, or a successor's
SuccessorPrompt warmed incrementally or built once its precursors ended), its request (through the
dual PD to a prefill target picked by load, sticky for a successor's warm-ups), and its streamed reply into the APC
and the trace. `Session._run` (orchestrator.py) builds one AgentRunner per agent with what it
needs, and nothing else of the session."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

from router.answer_cache import AnswerCache
from router.config import TopologyConfig
from router.context import RouterContext
from router.incremental import WarmupLoop
from router.pd import PDCall, PrefillTarget
from router.stream_reader import StreamReader
from router.successor_prompt import PromptGate, SuccessorPrompt, token_source
from router.template import TextSplicer, build_pieces, prompt_ids
from router.topology import critical_path_chance
from router.trace import AgentTrace, Clock
from sglang_ext import protocol as P


@dataclass(slots=True)
class AgentJob:
    """One agent of one question: what its run reads and writes."""

    agent_id: str
    cfg: TopologyConfig
    question: str
    # The router mode (orchestrator.MODES): warm incrementally (pipelined), or send the whole
    # prompt once the precursors ended (blocking) or once `layer_barrier` ended (blocking_layer).
    mode: str
    apc: AnswerCache
    trace: AgentTrace
    clock: Clock
    # Precursors early exit dropped from this agent's prompt (the session adds to it live).
    dropped: set[str]
    # The slot order to use instead of the template's or the dynamic one (exactness tests).
    forced_order: list[str] | None
    # Part of every rid: unique per session.
    rid_tag: str
    # The question's arrival number at the router (router/priority.py).
    arrival: int | None = None
    # blocking_layer: the agents of every earlier layer; the final request waits for them all.
    layer_barrier: list[str] = field(default_factory=list)
    # Routing's posterior correction: holds the prompt until the chosen answers were scored.
    gate: PromptGate | None = None

    @property
    def pipelined(self) -> bool:
        return self.mode == "pipelined"


class AgentRunner:
    def __init__(self, job: AgentJob, ctx: RouterContext) -> None:
        self.job, self.ctx = job, ctx
        self.model = job.cfg.agent(job.agent_id).model
        self.dep = ctx.deployments[self.model]
        self._warmups: WarmupLoop | None = None

    async def run(self) -> None:
        """Send the agent's request and stream its reply into the APC; raises on failure (a
        cancel aborts what is in flight on the workers first)."""
        job = self.job
        body = {
            P.SAMPLING_PARAMS: job.cfg.sampling_of(job.agent_id).to_sglang(),
            P.RETURN_LOGPROB: True,
            P.RID: f"moa-{job.rid_tag}-{job.agent_id}-{uuid.uuid4().hex[:6]}",
        }
        if not job.cfg.precursors(job.agent_id):
            tok = self.ctx.tokenizer(self.model)
            body[P.INPUT_IDS] = prompt_ids(tok, job.cfg.template_of(job.agent_id), job.question)
            job.trace.final_request_s = job.clock.now()
            # We pick the pair now, by load and share, and send to both workers ourselves, as
            # for a successor (router/pd.py says why not through the native sglang-router).
            with self.dep.pinned(job.arrival) as target:
                job.trace.prefill_replica = target.index
                await self._stream(self.dep.dual(body, target))
            return
        # The prefill worker is chosen when the first request for it goes out: the first
        # warm-up's, or without warm-ups the final request's (then by the load of that moment).
        warms = job.pipelined and job.cfg.incremental_prefill.enabled
        target = self.dep.pick_prefill(job.arrival) if warms else None
        answered = False
        try:
            if target is not None:
                job.trace.prefill_replica = target.index
            body[P.INPUT_IDS] = await self._successor_prompt(target)
            if target is None:
                target = self.dep.pick_prefill(job.arrival)
                job.trace.prefill_replica = target.index
            job.trace.final_request_s = job.clock.now()
            await self._stream(self.dep.dual(body, target))
            answered = True
        finally:
            try:
                if self._warmups is not None:
                    # A warm-up may still be in flight beside the final request: awaited after
                    # an answer, aborted on the worker when the agent was cancelled or failed.
                    await self._warmups.settle(abort=not answered)
            finally:
                if target is not None:
                    self.dep.unpin(target)

    async def _successor_prompt(self, target: PrefillTarget | None) -> list[int]:
        """The complete prompt: warmed on the way on `target` (pipelined with incremental
        prefill) or built once all precursors ended (else; `target` is None). Both build it with
        the same SuccessorPrompt, so given the same slot order it is the same token list."""
        job = self.job
        prompt = self._prompt()
        wait_s = self.ctx.timeouts.precursor_wait_s
        if target is not None:
            m = self.ctx.metrics

            def count(n_tokens: int, _meta: dict) -> None:
                m.warmups.labels(self.model).inc()
                m.warmup_tokens.labels(self.model).inc(n_tokens)

            loop = WarmupLoop(
                prompt,
                job.apc,
                self.dep,
                target,
                job.cfg.incremental_prefill,
                job.trace,
                job.clock,
                f"{P.WARMUP_RID_PREFIX}{job.rid_tag}-{job.agent_id}-",
                wait_s,
                count,
                critical_path_chance(job.cfg, job.agent_id),
                caps={
                    p: cap
                    for p in prompt.pieces.slots
                    if (cap := job.cfg.sampling_of(p).max_new_tokens) is not None
                },
            )
            self._warmups = loop
            ids = await loop.run()
        else:
            # Blocking: nothing goes out (and no dynamic slot is assigned) before every kept
            # precursor has ended; a failed one fails this agent in `state()`. By layer, first
            # every agent of the earlier layers (whichever way each ended).
            try:
                await job.apc.wait_all_ended(job.layer_barrier, wait_s)
            except TimeoutError as e:
                waiting = [a for a in job.layer_barrier if not job.apc[a].ended]
                raise TimeoutError(
                    f"agent '{job.agent_id}' waited {wait_s:g}s at its layer barrier for "
                    f"{waiting} without progress"
                ) from e
            try:
                await job.apc.wait_ended(prompt.kept, wait_s)
            except TimeoutError as e:
                raise TimeoutError(
                    f"agent '{job.agent_id}' waited {wait_s:g}s for its precursors "
                    f"{prompt.kept()} without progress"
                ) from e
            if job.gate is not None:
                prompt.check_precursors()  # a failed precursor fails it now, not at the gate
                await job.gate.wait(wait_s)
            ids = prompt.state().ids
        job.trace.slot_order = list(prompt.order)
        return ids

    def _prompt(self) -> SuccessorPrompt:
        job, cfg = self.job, self.job.cfg
        tok = self.ctx.tokenizer(self.model)
        pieces = build_pieces(tok, cfg.template_of(job.agent_id), job.question)
        sources = {}
        for p in pieces.slots:
            ptok = self.ctx.tokenizer(cfg.agent(p).model)
            if ptok.family == tok.family:
                sources[p] = token_source(tok.eot_ids)
            else:
                splicer = TextSplicer(tok)
                sources[p] = lambda a, sp=splicer: sp.ids(a.text, a.done)
        return SuccessorPrompt(
            job.agent_id,
            pieces,
            sources,
            job.apc,
            job.dropped,
            slot_order=cfg.slot_order,
            forced_order=job.forced_order,
            gate=job.gate,
        )

    async def _stream(self, call: PDCall) -> None:
        """Stream one generate call into the APC; abort it on the workers if it did not end."""
        job = self.job
        apc, trace, clock = job.apc, job.trace, job.clock
        finished = False
        try:
            reader = StreamReader(self.ctx.tokenizer(self.model))
            async for chunk in call.stream:
                d = reader.feed(chunk)
                if d.ids and trace.first_token_s is None:
                    trace.first_token_s = clock.now()
                    call.hold.release()  # a first token means the prefill is over
                apc.append(job.agent_id, d.ids, d.logprobs, d.text)
            finished = True
        finally:
            call.hold.release()  # whatever happened, this call no longer holds the gate
            if not finished:
                await asyncio.shield(self.dep.abort(call))
            # Close the stream now, not when it is collected: closing ends its decode worker's
            # busy count on a shared device (router/compute_device.py).
            if (aclose := getattr(call.stream, "aclose", None)) is not None:
                await aclose()
        if (text := reader.final_text()) != apc[job.agent_id].text:
            apc.append(job.agent_id, [], [], text)
        meta = reader.meta
        trace.finish_reason = meta.get(P.FINISH_REASON)
        # Both workers count the same prompt; the prefill worker's reply has the true
        # `cached_tokens`. Decode's reply carries prefill's value over the KV metadata too
        # (SGLang 0.5.4+ and the reference engine; 0 on 0.5.3 + NIXL), the fallback here.
        prefill = call.prefill.meta
        trace.prompt_tokens = prefill.get(P.PROMPT_TOKENS, meta.get(P.PROMPT_TOKENS))
        trace.cached_tokens = prefill.get(P.CACHED_TOKENS, meta.get(P.CACHED_TOKENS))
        trace.worker_timing = worker_timing(prefill, meta)
        if call.prefill.at is not None:
            trace.prefill_reply_s = clock.at(call.prefill.at)
        if (
            job.cfg.precursors(job.agent_id)
            and trace.cached_tokens is not None
            and trace.prompt_tokens
        ):
            self.ctx.metrics.cached_ratio.labels(self.model, job.mode).observe(
                trace.cached_tokens / trace.prompt_tokens
            )


def worker_timing(prefill_meta: dict, decode_meta: dict) -> dict[str, float]:
    """The final request's timings as the workers reported them (SGLang's meta_info names),
    prefixed by the worker that reported each."""
    out = {}
    for side, meta in (("prefill", prefill_meta), ("decode", decode_meta)):
        for key in P.WORKER_TIMING_KEYS:
            if isinstance(meta.get(key), (int, float)):
                out[f"{side}.{key}"] = float(meta[key])
    return out
