"""One agent's requests within a Session: its prompt (a first-layer template, or a successor's
SuccessorPrompt warmed incrementally or built once its precursors ended), its request (through the
native sglang-router, or dual PD to a sticky prefill target), and its streamed reply into the APC
and the trace. `Session._run` (orchestrator.py) runs one AgentRunner per agent."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING

from router.incremental import WarmupLoop
from router.pd import PDCall, PrefillTarget
from router.stream_reader import StreamReader
from router.successor_prompt import SuccessorPrompt, token_source
from router.template import TextSplicer, build_pieces, prompt_ids
from sglang_ext import protocol as P

if TYPE_CHECKING:
    from router.orchestrator import Session


class AgentRunner:
    def __init__(self, session: Session, agent_id: str) -> None:
        self.s, self.agent_id = session, agent_id
        self.model = session.cfg.agent(agent_id).model
        self.trace = session.traces[agent_id]
        self.dep = session.ctx.deployments[self.model]

    async def run(self) -> None:
        """Send the agent's request and stream its reply into the APC; raises on failure (a
        cancel aborts what is in flight on the workers first)."""
        s, agent_id = self.s, self.agent_id
        body = {
            P.SAMPLING_PARAMS: s.cfg.sampling_of(agent_id).to_sglang(),
            P.RETURN_LOGPROB: True,
            P.RID: f"moa-{s.rid_tag}-{agent_id}-{uuid.uuid4().hex[:6]}",
        }
        if not s.cfg.precursors(agent_id):
            tok = s.ctx.tokenizer(self.model)
            body[P.INPUT_IDS] = prompt_ids(tok, s.cfg.template_of(agent_id), s.question)
            await self._stream(self.dep.via_router(body))
            return
        target = self.dep.pick_prefill()
        self.trace.prefill_url = target.url
        try:
            body[P.INPUT_IDS] = await self._successor_prompt(target)
            self.trace.final_request_s = s.clock.now()
            await self._stream(self.dep.dual(body, target))
        finally:
            self.dep.unpin(target)

    async def _successor_prompt(self, target: PrefillTarget) -> list[int]:
        """The complete prompt: warmed on the way (pipelined) or built once all precursors
        ended (blocking). Both build it with the same SuccessorPrompt, so given the same slot
        order it is the same token list."""
        s, agent_id = self.s, self.agent_id
        prompt = self._prompt()
        wait_s = s.ctx.timeouts.precursor_wait_s
        if s.mode == "pipelined" and s.cfg.incremental_prefill.enabled:
            m = s.ctx.metrics

            def count(n_tokens: int, _meta: dict) -> None:
                m.warmups.labels(self.model).inc()
                m.warmup_tokens.labels(self.model).inc(n_tokens)

            loop = WarmupLoop(
                prompt,
                s.apc,
                self.dep,
                target,
                s.cfg.incremental_prefill,
                self.trace,
                f"{P.WARMUP_RID_PREFIX}{s.rid_tag}-{agent_id}-",
                wait_s,
                count,
            )
            ids = await loop.run()
        else:
            # Blocking: nothing goes out (and no dynamic slot is assigned) before every kept
            # precursor has ended; a failed one fails this agent in `state()`.
            try:
                await s.apc.wait_ended(prompt.kept, wait_s)
            except TimeoutError as e:
                raise TimeoutError(
                    f"agent '{agent_id}' waited {wait_s:g}s for its precursors {prompt.kept()} "
                    "without progress"
                ) from e
            ids = prompt.state().ids
        self.trace.slot_order = list(prompt.order)
        return ids

    def _prompt(self) -> SuccessorPrompt:
        s = self.s
        tok = s.ctx.tokenizer(self.model)
        pieces = build_pieces(tok, s.cfg.template_of(self.agent_id), s.question)
        sources = {}
        for p in pieces.slots:
            ptok = s.ctx.tokenizer(s.cfg.agent(p).model)
            if ptok.family == tok.family:
                sources[p] = token_source(tok.eot_ids)
            else:
                splicer = TextSplicer(tok)
                sources[p] = lambda a, sp=splicer: sp.ids(a.text, a.done)
        return SuccessorPrompt(
            self.agent_id,
            pieces,
            sources,
            s.apc,
            s.dropped[self.agent_id],
            dynamic=s.cfg.slot_order == "dynamic",
            forced_order=s.slot_orders.get(self.agent_id),
        )

    async def _stream(self, call: PDCall) -> None:
        """Stream one generate call into the APC; abort it on the workers if it did not end."""
        apc, trace, clock = self.s.apc, self.trace, self.s.clock
        reader = StreamReader(self.s.ctx.tokenizer(self.model))
        finished = False
        try:
            async for chunk in call.stream:
                d = reader.feed(chunk)
                if d.ids and trace.first_token_s is None:
                    trace.first_token_s = clock.now()
                apc.append(self.agent_id, d.ids, d.logprobs, d.text)
            finished = True
        finally:
            if not finished:
                await asyncio.shield(self.dep.abort(call))
        if (text := reader.final_text()) != apc[self.agent_id].text:
            apc.append(self.agent_id, [], [], text)
        meta = reader.meta
        trace.finish_reason = meta.get(P.FINISH_REASON)
        # Both workers count the same prompt; only the prefill worker knows what it found cached.
        # Through the native sglang-router its reply is not visible: no number beats a wrong one.
        trace.prompt_tokens = call.prefill_meta.get(P.PROMPT_TOKENS, meta.get(P.PROMPT_TOKENS))
        trace.cached_tokens = call.prefill_meta.get(P.CACHED_TOKENS)
        if trace.cached_tokens is not None and trace.prompt_tokens:
            self.s.ctx.metrics.cached_ratio.labels(self.model, self.s.mode).observe(
                trace.cached_tokens / trace.prompt_tokens
            )
