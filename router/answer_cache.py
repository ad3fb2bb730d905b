"""The Agent Prompt Cache (APC): each agent's output of one session as it streams in (token ids,
logprobs, text, done/failed/killed), and async waits on it. Written by the orchestrator, read by
successor prompts, the warm-up loop, the per-agent stream and the early-exit hook."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field


class PrecursorFailed(RuntimeError):
    """A successor cannot run because a precursor failed; the message names it and the cause."""


@dataclass(slots=True)
class AgentAnswer:
    agent_id: str
    output_ids: list[int] = field(default_factory=list)
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
    """One session's answers. Every change bumps `version` and wakes all waiters."""

    def __init__(self, agent_ids: list[str]) -> None:
        self._answers = {a: AgentAnswer(a) for a in agent_ids}
        # Futures of coroutines waiting for the next change; a plain list, set on every change.
        self._waiters: list[asyncio.Future] = []
        self._finish_counter = itertools.count()
        self.version = 0

    def __getitem__(self, agent_id: str) -> AgentAnswer:
        return self._answers[agent_id]

    def __contains__(self, agent_id: str) -> bool:
        return agent_id in self._answers

    def answers(self) -> list[AgentAnswer]:
        return list(self._answers.values())

    # --- writers (the orchestrator) -------------------------------------------------------------
    def append(self, agent_id: str, ids: list[int], logprobs: list[float], text: str) -> None:
        a = self._answers[agent_id]
        a.output_ids.extend(ids)
        a.logprobs.extend(logprobs)
        a.text = text
        self._bump()

    def finish(self, agent_id: str) -> None:
        a = self._answers[agent_id]
        a.done = True
        a.finish_seq = next(self._finish_counter)
        self._bump()

    def fail(self, agent_id: str, message: str) -> None:
        self._answers[agent_id].error = message
        self._bump()

    def kill(self, agent_id: str) -> None:
        self._answers[agent_id].killed = True
        self._bump()

    def touch(self) -> None:
        """Wake waiters after a change that lives outside the APC (a dropped slot)."""
        self._bump()

    def _bump(self) -> None:
        self.version += 1
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    # --- readers --------------------------------------------------------------------------------
    async def wait_change(self, since_version: int, timeout: float | None = None) -> int:
        """Return once `version` differs from `since_version` (TimeoutError after `timeout`)."""
        while self.version == since_version:
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            await asyncio.wait_for(fut, timeout)
        return self.version

    async def wait_for(
        self, agent_id: str, n_tokens: int, timeout: float | None = None
    ) -> AgentAnswer:
        """Return once `agent_id` has `n_tokens` output tokens or has ended."""
        a = self._answers[agent_id]
        while len(a.output_ids) < n_tokens and not a.ended:
            await self.wait_change(self.version, timeout)
        return a

    async def wait_ended(self, agent_ids: list[str], timeout: float | None = None) -> None:
        while not all(self._answers[a].ended for a in agent_ids):
            await self.wait_change(self.version, timeout)

    def release(self) -> None:
        """Drop every answer (the session ended) and wake waiters so none is left hanging."""
        for a in self._answers.values():
            a.output_ids, a.logprobs, a.text = [], [], ""
        self._bump()
