"""One successor's warm-up loop (pipelined mode): warm the static prefix, then extend the warmed
prefix as precursor tokens arrive, one prefill-only request at a time and only through the target
worker's PrefillGate, until every slot is complete. Called by the agent runner; returns the final
prompt's token ids the moment it is complete, even with a warm-up still in flight (`settle`
awaits that one)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Mapping

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
    warmed: list[int], ready: list[int], policy: IncrementalPrefill, last: bool = False
) -> list[int] | None:
    """The prefix the next warm-up should carry, or None to wait for more tokens. `last`: the
    prompt's last precursor is about to stop at its cap, so whatever is new goes now (`ready`).

    Whatever of `warmed` is no longer a prefix of `ready` (a dropped slot moved later slots) is
    stale: the next warm-up re-extends from the longest valid prefix, and the radix cache
    recomputes only from there.
    """
    valid = common_prefix_len(warmed, ready)
    new = len(ready) - valid
    if new <= 0:
        return None
    if last:
        return ready
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

    The loop returns the complete prompt as soon as it is complete, not when the warm-up in
    flight replies: the final request then goes out at once and its PD handshake overlaps that
    warm-up's forward. The worker matches a request's prefix in the radix cache when it schedules
    it, so the final request finds the warm-up's KV where that warm-up's forward ran first, and
    recomputes that part where both were scheduled in one round; either way its tokens are the
    same. A warm-up that no longer leads the complete prompt (a slot was dropped) is aborted.
    `settle` awaits that warm-up (its trace and gate slot), or aborts it where the agent was
    cancelled or failed; an error of it is moot then and only logged.
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
        caps: Mapping[str, int] | None = None,
    ) -> None:
        """`on_warmup(n_tokens, meta_info)` is called after each warm-up returned (metrics).
        `benefit`: the successor's chance of being on its question's critical path, which the
        gate weighs against the decodes a warm-up slows (router/compute_device.py). `caps`:
        the precursors' max_new_tokens, for the warm-up timed to a precursor's cap
        (`policy.warm_before_cap`)."""
        self._prompt, self._apc, self._dep, self._target = prompt, apc, deployment, target
        self._gate = deployment.gate(target)
        self._key = (deployment.warmup_rank(target), next(self._arrivals))
        self._policy, self._trace, self._clock = policy, trace, clock
        self._rid_prefix, self._wait_s = rid_prefix, precursor_wait_s
        self._on_warmup, self._benefit = on_warmup, benefit
        # The APC changes this loop wakes for: its precursors' (and touches: drops, routing).
        self._watch = tuple(prompt.pieces.slots)
        self._caps = dict(caps or {})
        # The precursor the last warm-up was timed to the cap of (one such warm-up each), and
        # each precursor's first sighting (seconds, tokens): its token rate since.
        self._timed_to: str | None = None
        self._first_seen: dict[str, tuple[float, int]] = {}
        self._in_flight: asyncio.Future | None = None

    async def run(self) -> list[int]:
        """Warm until the prompt is complete; return the complete prompt."""
        try:
            return await self._run()
        finally:
            self._gate.unqueue(self._key)

    async def settle(self, abort: bool = False) -> None:
        """Await the warm-up still in flight when `run` returned, if any; `abort`: cancel it
        first (`_warm` aborts it on the worker), for an agent that was cancelled or failed."""
        task, self._in_flight = self._in_flight, None
        if task is None:
            return
        if abort:
            task.cancel()
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():  # this coroutine was cancelled, not (only) the warm-up
                task.cancel()
                raise
        except Exception as e:  # noqa: BLE001 - the final request superseded it
            log.debug("%s: a warm-up after the prompt completed failed: %r", self._rid_prefix, e)

    async def _run(self) -> list[int]:
        warmed: list[int] = []
        while True:
            seen = self._apc.changes(self._watch)
            state = self._prompt.state()
            if state.complete:
                return state.ids
            last = bool(warmed) and self._cap_within_a_warmup(state.last_open)
            if not warmed:
                chunk = state.ids or None  # the static prefix, whatever the chunk policy
            else:
                chunk = next_warmup(warmed, state.ids, self._policy, last)
            if chunk is None:
                self._gate.unqueue(self._key)  # nothing to send: let the others go first
                await self._wait(seen, for_gate=False)
                continue
            if not self._gate.try_enter(self._key, self._benefit):
                self._gate.queue(self._key, self._benefit)
                await self._wait(seen, for_gate=True)
                continue
            if last:
                self._timed_to = state.last_open
            task = asyncio.ensure_future(self._warm_and_leave(chunk))
            if (ids := await self._until_warmed(task)) is not None:
                if ids[: len(chunk)] != chunk:
                    task.cancel()  # a dropped slot: this warm-up's KV leads nowhere now
                self._in_flight = task
                return ids
            warmed = chunk

    async def _warm_and_leave(self, ids: list[int]) -> None:
        try:
            await self._warm(ids)
        finally:
            self._gate.leave()

    async def _until_warmed(self, task: asyncio.Future) -> list[int] | None:
        """Wait for the warm-up `task`; None once it replied (its error raised), or the complete
        prompt as soon as a precursor's end completes it first (the task left running)."""
        try:
            while not task.done():
                seen = self._apc.changes(self._watch)
                _, ends = self._prompt.progress()
                change = asyncio.ensure_future(self._apc.wait_change(seen, None, self._watch))
                try:
                    await asyncio.wait([task, change], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    change.cancel()
                if change.done() and not change.cancelled():
                    change.result()  # SessionReleased and the like surface here, as in `_wait`
                if (
                    self._policy.final_beside_warmup
                    and not task.done()
                    and self._prompt.progress()[1] != ends
                    and (state := self._prompt.state()).complete
                ):
                    return state.ids
        except BaseException:
            task.cancel()  # cancelled, or a precursor failed: `_warm` aborts it on the worker
            with contextlib.suppress(BaseException):
                await task
            raise
        task.result()
        return None

    def _cap_within_a_warmup(self, precursor: str | None) -> bool:
        """Whether `precursor`, the last one the prompt waits for, will reach its cap within the
        tokens it streams during one warm-up (its rate since first seen × the last warm-up's
        seconds): then the last warm-up goes now. Once per precursor; False where its cap,
        its rate or a warm-up's time is not known yet."""
        if (
            precursor is None
            or not self._policy.warm_before_cap
            or precursor == self._timed_to
            or (cap := self._caps.get(precursor)) is None
            or not self._trace.warmup_spans
        ):
            return False
        now, streamed = self._clock.now(), len(self._apc[precursor].output_ids)
        t0, n0 = self._first_seen.setdefault(precursor, (now, streamed))
        if now <= t0 or streamed <= n0:
            return False
        sent, replied = self._trace.warmup_spans[-1][:2]
        return cap - streamed <= self._policy.cap_lead((streamed - n0) / (now - t0), replied - sent)

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
