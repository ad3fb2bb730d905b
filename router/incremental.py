"""One successor's warm-up loop (pipelined mode): warm the static prefix at once, then keep at most
one prefill-only request in flight and extend the warmed prefix as precursor tokens arrive, until
every slot is complete. Called by the orchestrator; returns the final prompt's token ids."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from router.answer_cache import AnswerCache
from router.config import IncrementalPrefill
from router.pd import Deployment, PrefillTarget
from router.successor_prompt import SuccessorPrompt
from router.trace import AgentTrace
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
        return ready  # self-clocking: all that arrived while the last warm-up ran
    if new < policy.chunk_tokens:
        return None
    return ready[: valid + policy.chunk_tokens]


class WarmupLoop:
    """Warm-ups of one successor on its pinned prefill target; `run` returns the final prompt."""

    def __init__(
        self,
        prompt: SuccessorPrompt,
        apc: AnswerCache,
        deployment: Deployment,
        target: PrefillTarget,
        policy: IncrementalPrefill,
        trace: AgentTrace,
        rid_prefix: str,
        precursor_wait_s: float,
        on_warmup: Callable[[int, dict], None] | None = None,
    ) -> None:
        """`on_warmup(n_tokens, meta_info)` is called after each warm-up returned (metrics)."""
        self._prompt, self._apc, self._dep, self._target = prompt, apc, deployment, target
        self._policy, self._trace, self._rid_prefix = policy, trace, rid_prefix
        self._wait_s = precursor_wait_s
        self._on_warmup = on_warmup

    async def run(self) -> list[int]:
        """Warm until the prompt is complete; return the complete prompt."""
        warmed: list[int] = []
        first = True
        while True:
            seen = self._apc.version
            state = self._prompt.state()
            if state.complete:
                return state.ids
            # The static prefix goes at once, whatever the chunk policy.
            chunk = state.ids if first else next_warmup(warmed, state.ids, self._policy)
            first = False
            if not chunk:  # nothing new, or an empty static prefix: nothing to warm yet
                try:
                    await self._apc.wait_change(seen, self._wait_s)
                except TimeoutError as e:
                    raise TimeoutError(
                        f"agent '{self._prompt.successor}' waited {self._wait_s:g}s for "
                        f"precursors {self._prompt.kept()} without progress"
                    ) from e
                continue
            await self._warm(chunk)
            warmed = chunk

    async def _warm(self, ids: list[int]) -> None:
        rid = f"{self._rid_prefix}{self._trace.warmups}"
        try:
            meta = await self._dep.warmup(self._target, ids, rid)
        except BaseException:
            # Killed, timed out or cut off mid warm-up: the worker may still be prefilling it.
            await asyncio.shield(self._dep.abort_warmup(self._target, rid))
            raise
        self._trace.warmups += 1
        self._trace.warmup_lengths.append(len(ids))
        self._trace.warmup_cached_tokens += int(meta.get(P.CACHED_TOKENS) or 0)
        if self._on_warmup is not None:
            self._on_warmup(len(ids), meta)
