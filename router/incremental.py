"""One successor's warm-up loop (pipelined mode): warm the static prefix, then extend the warmed
prefix as precursor tokens arrive, one prefill-only request at a time and only through the target
worker's PrefillGate, until every slot is complete. Called by the agent runner; returns the final
prompt's token ids."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

from router.answer_cache import AnswerCache
from router.config import IncrementalPrefill
from router.pd import Deployment, PrefillTarget
from router.successor_prompt import SuccessorPrompt
from router.trace import AgentTrace, Clock
from sglang_ext import protocol as P

log = logging.getLogger(__name__)


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def next_warmup(
    warmed: list[int], ready: list[int], policy: IncrementalPrefill
) -> list[int] | None:
    """The prefix the next warm-up should carry, or None to wait for more tokens.

    Whatever of `warmed` is no longer a prefix of `ready` (a dropped slot moved later slots) is
    stale: the next warm-up re-extends from the longest valid prefix, and the radix cache
    recomputes only from there.
    """
    valid = common_prefix_len(warmed, ready)
    new = len(ready) - valid
    if new <= 0:
        return None
    if policy.chunk_policy == "adaptive":
        # Self-clocking: all that arrived while the last warm-up ran, once it is worth a step.
        return ready if new >= policy.min_chunk_tokens else None
    if new < policy.chunk_tokens:
        return None
    return ready[: valid + policy.chunk_tokens]


class WarmupLoop:
    """Warm-ups of one successor on its pinned prefill target; `run` returns the final prompt.

    Every warm-up passes the target worker's PrefillGate first: it waits while a critical prefill
    is outstanding there, and what it carries is decided only once the gate let it through, so a
    warm-up that waited carries everything that arrived meanwhile, and one whose prompt completed
    meanwhile is never sent (the final request supersedes it). The static prefix goes first, as
    soon as the gate opens (so never before the leaves' own prompts were prefilled). A warm-up
    ready to go queues at the gate by (its question's rank, when its successor started): under
    workflow priority an older question's warm-ups go first, else successors take turns in
    the order they started (router/priority.py).
    """

    # Successors in the order their warm-ups started: a gate serves equal ranks in this order.
    _arrivals = itertools.count()

    def __init__(
        self,
        prompt: SuccessorPrompt,
        apc: AnswerCache,
        deployment: Deployment,
        target: PrefillTarget,
        policy: IncrementalPrefill,
        trace: AgentTrace,
        clock: Clock,
        rid_prefix: str,
        precursor_wait_s: float,
        on_warmup: Callable[[int, dict], None] | None = None,
        benefit: float = 1.0,
    ) -> None:
        """`on_warmup(n_tokens, meta_info)` is called after each warm-up returned (metrics).
        `benefit`: the successor's chance of being on its question's critical path, which the
        gate weighs against the decodes a warm-up slows (router/compute_device.py)."""
        self._prompt, self._apc, self._dep, self._target = prompt, apc, deployment, target
        self._gate = deployment.gate(target)
        self._key = (deployment.warmup_rank(target), next(self._arrivals))
        self._policy, self._trace, self._clock = policy, trace, clock
        self._rid_prefix, self._wait_s = rid_prefix, precursor_wait_s
        self._on_warmup, self._benefit = on_warmup, benefit
        # The APC changes this loop wakes for: its precursors' (and touches: drops, routing).
        self._watch = tuple(prompt.pieces.slots)

    async def run(self) -> list[int]:
        """Warm until the prompt is complete; return the complete prompt."""
        try:
            return await self._run()
        finally:
            self._gate.unqueue(self._key)

    async def _run(self) -> list[int]:
        warmed: list[int] = []
        while True:
            seen = self._apc.changes(self._watch)
            state = self._prompt.state()
            if state.complete:
                return state.ids
            if not warmed:
                chunk = state.ids or None  # the static prefix, whatever the chunk policy
            else:
                chunk = next_warmup(warmed, state.ids, self._policy)
            if chunk is None:
                self._gate.unqueue(self._key)  # nothing to send: let the others go first
                await self._wait(seen, for_gate=False)
                continue
            if not self._gate.try_enter(self._key, self._benefit):
                self._gate.queue(self._key, self._benefit)
                await self._wait(seen, for_gate=True)
                continue
            try:
                await self._warm(chunk)
            finally:
                self._gate.leave()
            warmed = chunk

    async def _wait(self, seen: int, for_gate: bool) -> None:
        """Until what the loop does next can change. Waiting for tokens (not `for_gate`): any
        progress of this successor's precursors. Queued at the gate (`for_gate`): the gate's
        change, or a precursor ending, failing or dropped (the prompt may be complete now); new
        tokens alone wait, since what a warm-up carries is read when the gate lets it through.

        Other agents' tokens wake nothing (the APC wait is scoped to this successor's
        precursors), and at a closed gate its precursors' tokens only re-arm the wait:
        recomputing each successor's prompt on every token of the session (re-tokenizing another
        family's text) was the pipelined router's extra CPU under load, also where the gate let
        no warm-up through (issue 28: `tree_9_3_1_mixed_cpu` at concurrency 4). TimeoutError
        when the precursors make no progress for `precursor_wait_s`."""
        tokens, ends = self._prompt.progress()
        clock = asyncio.get_running_loop()
        deadline = clock.time() + self._wait_s
        gate = asyncio.ensure_future(self._gate.wait_change()) if for_gate else None
        try:
            while True:
                change = asyncio.ensure_future(
                    self._apc.wait_change(seen, max(0.0, deadline - clock.time()), self._watch)
                )
                try:
                    await asyncio.wait(
                        [change] if gate is None else [change, gate],
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    change.cancel()
                if gate is not None and gate.done():
                    return
                if isinstance(change.exception(), TimeoutError):
                    raise TimeoutError(
                        f"agent '{self._prompt.successor}' waited {self._wait_s:g}s for "
                        f"precursors {self._prompt.kept()} without progress"
                    )
                seen = change.result()  # SessionReleased and the like surface here
                now_tokens, now_ends = self._prompt.progress()
                if now_ends != ends:
                    return
                if now_tokens != tokens:
                    if gate is None:
                        return
                    tokens, deadline = now_tokens, clock.time() + self._wait_s
        finally:
            if gate is not None:
                gate.cancel()

    async def _warm(self, ids: list[int]) -> None:
        rid = f"{self._rid_prefix}{self._trace.warmups}"
        sent = self._clock.now()
        try:
            meta = await self._dep.warmup(self._target, ids, rid)
        except BaseException:
            # Killed, timed out or cut off mid warm-up: the worker may still be prefilling it.
            await asyncio.shield(self._dep.abort_warmup(self._target, rid))
            raise
        cached = int(meta.get(P.CACHED_TOKENS) or 0)
        self._trace.warmups += 1
        self._trace.warmup_lengths.append(len(ids))
        self._trace.warmup_cached_tokens += cached
        self._trace.warmup_spans.append([sent, self._clock.now(), len(ids), cached])
        if self._on_warmup is not None:
            self._on_warmup(len(ids), meta)
