"""One successor's prompt as it grows: which precursor fills which slot position (the config's
`slot_order`), and the longest contiguous token prefix its precursors' outputs allow so far.
Read by incremental.py (warm-ups) and the orchestrator (the final prompt, both modes).

The slot orders: `template`, as the template lists the slots; `dynamic`, the precursor that
finished first (else has streamed most) takes the next position, which follows the timing of one
run, so a blocking run reproduces a pipelined one only when given its order (`forced_order`);
`shortest_first`, by output length, shortest first (template order among equals): a function of
the outputs alone, so both modes build the same prompt, and causal: a finished precursor takes
the next position once no other left can still end shorter (every one still streaming has
passed its length), which for precursors of one speed is about when it finishes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from router.answer_cache import AgentAnswer, AnswerCache, PrecursorFailed
from router.template import PromptPieces, clean_output

# Turns a precursor's APC entry into the token ids to splice (same family: cleaned ids; another
# family: a TextSplicer).
SlotSource = Callable[[AgentAnswer], list[int]]


@dataclass(slots=True)
class PromptState:
    """The prompt so far: `ids` is the longest token prefix the precursors' outputs determine
    now (every later state extends it unless a slot is dropped); `complete` once every kept slot
    is done and `ids` is the whole prompt. `last_open`: the precursor whose stream `ids` ends
    in when it is the only kept one still streaming (its end completes the prompt), else None."""

    ids: list[int]
    complete: bool
    last_open: str | None = None


def token_source(eot_ids: frozenset[int]) -> SlotSource:
    """The slot source of a precursor of the successor's tokenizer family: its output ids with
    end-of-turn tokens removed, spliced as they are."""
    return lambda a: clean_output(a.output_ids, eot_ids)


@dataclass(slots=True)
class PromptGate:
    """Holds a successor's prompt incomplete until posterior correction decided (routing):
    `release(last)` completes it, with `last` (low-scoring answers) after the others."""

    last: list[str] = field(default_factory=list)
    event: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def is_open(self) -> bool:
        return self.event.is_set()

    def release(self, last: list[str]) -> None:
        self.last = list(last)
        self.event.set()

    async def wait(self, timeout: float | None) -> None:
        await asyncio.wait_for(self.event.wait(), timeout)


class SuccessorPrompt:
    """One successor's prompt in one session, grown from its precursors' APC entries."""

    def __init__(
        self,
        successor: str,
        pieces: PromptPieces,
        sources: dict[str, SlotSource],
        apc: AnswerCache,
        dropped: set[str],
        slot_order: str = "template",
        forced_order: list[str] | None = None,
        gate: PromptGate | None = None,
    ) -> None:
        self.successor = successor
        self.pieces = pieces
        self._sources = sources
        self._apc = apc
        # Owned by the session: early exit adds to it while this prompt is being built.
        self._dropped = dropped
        self._slot_order = slot_order
        self._forced = forced_order
        self._gate = gate
        # Precursors committed to positions 1, 2, ... so far; a committed slot never moves
        # unless one before it is dropped.
        self.order: list[str] = []

    def kept(self) -> list[str]:
        return [s for s in self.pieces.slots if s not in self._dropped]

    def check_precursors(self) -> None:
        """Raise PrecursorFailed when a precursor this prompt still needs has failed."""
        for p in self.kept():
            a = self._apc[p]
            if a.error is not None:
                raise PrecursorFailed(
                    f"agent '{self.successor}' cannot run: its precursor '{p}' failed: {a.error}"
                )
            if a.killed:
                raise PrecursorFailed(
                    f"agent '{self.successor}' cannot run: its precursor '{p}' was aborted "
                    "before it finished"
                )

    def progress(self) -> tuple[int, tuple]:
        """A cheap fingerprint of what `state()` reads: (the precursors' output tokens so far,
        all together; everything else that can change the prompt: each precursor ended, failed
        or killed, the dropped slots, the routing gate). The warm-up loop recomputes the prompt
        only when it changed."""
        answers = [self._apc[s] for s in self.pieces.slots]
        ends = (
            tuple((a.done, a.error is not None, a.killed) for a in answers),
            tuple(s in self._dropped for s in self.pieces.slots),
            None if self._gate is None else (self._gate.is_open, tuple(self._gate.last)),
        )
        return sum(len(a.output_ids) for a in answers), ends

    def state(self) -> PromptState:
        """The longest prefix determinable now; complete when every kept slot is done."""
        self.check_precursors()
        kept = self.kept()
        self.order = [a for a in self.order if a in kept]
        last = self._gate.last if self._gate is not None else []
        if last:
            # Posterior correction ordered these last: positions from the first one re-fill.
            self.order = [a for a in self.order if a not in last]
        ids = list(self.pieces.head)
        for pos in range(len(kept)):
            if pos == len(self.order):
                left = [a for a in kept if a not in self.order]
                nxt = self._choose([a for a in left if a not in last] or left)
                if nxt is None:
                    return PromptState(ids, False)
                self.order.append(nxt)
            answer = self._apc[self.order[pos]]
            ids += self._sources[answer.agent_id](answer)
            if not answer.done:
                alone = (self._gate is None or self._gate.is_open) and all(
                    self._apc[a].done for a in kept if a != answer.agent_id
                )
                return PromptState(ids, False, answer.agent_id if alone else None)
            ids += self.pieces.betweens[pos] if pos < len(kept) - 1 else self.pieces.tail
        if not kept:
            ids += self.pieces.tail
        return PromptState(ids, self._gate is None or self._gate.is_open)

    def _choose(self, candidates: list[str]) -> str | None:
        """The precursor for the next position (candidates are in template order)."""
        if self._gate is not None and self._gate.last and set(candidates) <= set(self._gate.last):
            # `last` is worst first: the best of the low answers goes first, the worst at the end.
            return next(a for a in reversed(self._gate.last) if a in candidates)
        if self._forced is not None:
            return next((a for a in self._forced if a in candidates), candidates[0])
        if self._slot_order == "template":
            return candidates[0]
        answers = [self._apc[a] for a in candidates]
        if self._slot_order == "shortest_first":
            return _shortest_settled(answers)
        finished = [a for a in answers if a.done]
        if finished:
            return min(finished, key=lambda a: a.finish_seq).agent_id
        best = max(answers, key=lambda a: len(a.output_ids))
        return best.agent_id if best.output_ids else None


def _shortest_settled(answers: list[AgentAnswer]) -> str | None:
    """The shortest finished answer (the first of equals, in `answers`' order) once none still
    streaming can end shorter or equal before it; the last one left at once; else None."""
    if len(answers) == 1:
        return answers[0].agent_id
    finished = [(len(a.output_ids), i) for i, a in enumerate(answers) if a.done]
    if not finished:
        return None
    length, first = min(finished)
    for i, a in enumerate(answers):
        if a.done:
            continue
        streamed = len(a.output_ids)
        if streamed < length or (streamed == length and i < first):
            return None  # it may still end shorter, or as long and before it
    return answers[first].agent_id
