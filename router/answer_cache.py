"""The Agent Prompt Cache (APC): each agent's output of one session as it streams in (token ids,
logprobs, text, done/failed/killed), and async waits on it. Written by the orchestrator, read by
successor prompts, the warm-up loop, the per-agent stream and the early-exit hook."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field


class PrecursorFailed(RuntimeError):
    """A successor cannot run because a precursor failed; the message names it and the cause."""


class SessionReleased(RuntimeError):
    """The session's APC was released (the session ended) while something still waited on it."""


@dataclass(slots=True)
class AgentAnswer:
    agent_id: str
    output_ids: list[int] = field(default_factory=list)
    # logprobs[i] belongs to output_ids[i]; shorter when the worker sent none for some tokens.
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    done: bool = False
    killed: bool = False
    error: str | None = None
    # Order of completion within the session (dynamic slot order reads it); None until done.
    finish_seq: int | None = None

    @property
    def ended(self) -> bool:
        return self.done or self.killed or self.error is not None


class AnswerCache:
    """One session's answers. Every change bumps `version`; a wait names the agents it is about
    (`changes(agents)`, `wait_change(..., agents=)`) and wakes only for theirs.

    Why scoped: an entry grows by one token per worker chunk, so in a 9-3-1 tree every leaf token
    used to wake every waiter of the session (each successor's warm-up loop, each layer
    barrier), ~4 wake-ups per token of which ~1 could matter: the shell router's CPU on cores
    the workers share (issue 28). A change outside any entry (`touch`: a dropped slot, a routing
    decision) and `release` wake everyone."""

    def __init__(self, agent_ids: list[str]) -> None:
        self._answers = {a: AgentAnswer(a) for a in agent_ids}
        # Changes per agent, and those outside every entry (touch, release).
        self._changes = dict.fromkeys(agent_ids, 0)
        self._touches = 0
        # Futures of coroutines waiting for the next change, by the agent they watch (None: any
        # change); a waiter watching several agents sits in each of their sets.
        self._waiters: dict[str | None, set[asyncio.Future]] = {}
        self._finish_counter = itertools.count()
        self.version = 0
        self.released = False

    def __getitem__(self, agent_id: str) -> AgentAnswer:
        return self._answers[agent_id]

    def __contains__(self, agent_id: str) -> bool:
        return agent_id in self._answers

    # --- writers (the orchestrator) -------------------------------------------------------------
    def append(self, agent_id: str, ids: list[int], logprobs: list[float], text: str) -> None:
        a = self._answers[agent_id]
        a.output_ids.extend(ids)
        a.logprobs.extend(logprobs)
        a.text = text
        self._bump(agent_id)

    def finish(self, agent_id: str) -> None:
        a = self._answers[agent_id]
        a.done = True
        a.finish_seq = next(self._finish_counter)
        self._bump(agent_id)

    def fail(self, agent_id: str, message: str) -> None:
        self._answers[agent_id].error = message
        self._bump(agent_id)

    def kill(self, agent_id: str) -> None:
        self._answers[agent_id].killed = True
        self._bump(agent_id)

    def touch(self) -> None:
        """Wake every waiter after a change that lives outside the APC (a dropped slot, a
        routing decision)."""
        self._bump(None)

    def _bump(self, agent_id: str | None) -> None:
        self.version += 1
        if agent_id is None:
            self._touches += 1
            woken = set().union(*self._waiters.values())
            self._waiters = {}
        else:
            self._changes[agent_id] += 1
            woken = self._waiters.pop(agent_id, set()) | self._waiters.pop(None, set())
        for fut in woken:
            if not fut.done():
                fut.set_result(None)

    # --- readers --------------------------------------------------------------------------------
    def changes(self, agents: Iterable[str] | None = None) -> int:
        """A counter that moves when one of `agents` changes or on a touch (None: on any
        change): what `wait_change` compares against."""
        if agents is None:
            return self.version
        return self._touches + sum(self._changes[a] for a in agents)

    async def wait_change(
        self,
        since: int,
        timeout: float | None = None,
        agents: Iterable[str] | None = None,
    ) -> int:
        """Return `changes(agents)` once it differs from `since` (TimeoutError after
        `timeout`). SessionReleased once the APC was released: nothing will change any more."""
        agents = None if agents is None else tuple(agents)  # read twice below
        keys: tuple[str | None, ...] = (None,) if agents is None else agents
        while self.changes(agents) == since and not self.released:
            fut = asyncio.get_running_loop().create_future()
            for k in keys:
                self._waiters.setdefault(k, set()).add(fut)
            try:
                await asyncio.wait_for(fut, timeout)
            finally:
                for k in keys:  # the sets it was not woken from (or all, on a timeout)
                    if (waiting := self._waiters.get(k)) is not None:
                        waiting.discard(fut)
        if self.released:
            raise SessionReleased("the session ended (its answers were released) during the wait")
        return self.changes(agents)

    async def wait_for(
        self, agent_id: str, n_tokens: int, timeout: float | None = None
    ) -> AgentAnswer:
        """Return once `agent_id` has `n_tokens` output tokens or has ended."""
        a, watch = self._answers[agent_id], (agent_id,)
        while len(a.output_ids) < n_tokens and not a.ended:
            await self.wait_change(self.changes(watch), timeout, watch)
        return a

    async def wait_ended(
        self, agent_ids: Callable[[], Iterable[str]], timeout: float | None = None
    ) -> None:
        """Return once every agent `agent_ids()` names has ended, or one of them failed or was
        killed (the caller tells the two apart). `agent_ids` is re-read at every change: early
        exit can shrink the set. `timeout` bounds each wait for a change."""
        while True:
            ids = list(agent_ids())
            answers = [self._answers[a] for a in ids]
            if all(a.ended for a in answers) or any(a.error or a.killed for a in answers):
                return
            await self.wait_change(self.changes(ids), timeout, ids)

    async def wait_all_ended(self, agent_ids: Iterable[str], timeout: float | None = None) -> None:
        """Return once every agent of `agent_ids` has ended, whichever way (done, failed or
        killed): a layer barrier. `timeout` bounds each wait for a change."""
        ids = list(agent_ids)
        while not all(self._answers[a].ended for a in ids):
            await self.wait_change(self.changes(ids), timeout, ids)

    async def follow(self, agent_id: str) -> AsyncIterator[tuple[list[int], list[float], str]]:
        """(new ids, their logprobs, cumulative text) of one agent as its entry grows, until it
        ended."""
        answer, sent, watch = self._answers[agent_id], 0, (agent_id,)
        while True:
            seen = self.changes(watch)
            if len(answer.output_ids) > sent:
                n = len(answer.output_ids)
                yield answer.output_ids[sent:n], answer.logprobs[sent:n], answer.text
                sent = n
                continue
            if answer.ended:
                return
            await self.wait_change(seen, agents=watch)

    def release(self) -> None:
        """Drop every answer (the session ended) and wake waiters: they raise SessionReleased
        rather than wait for changes that never come."""
        self.released = True
        for a in self._answers.values():
            a.output_ids, a.logprobs, a.text = [], [], ""
        self._bump(None)
