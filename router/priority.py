"""The order in which the workers serve requests: the `priority` value each request carries
(SGLang's field, larger first) and a warm-up's place in its prefill worker's gate queue.

Two classes always: critical requests (a leaf's prompt, a successor's final request) above
warm-ups. Within a class:
- FCFS: every request equal; the workers serve them in arrival order, the gate its queued
  warm-ups in the order their successors started.
- Workflow priority (after Kairos' workflow-aware scheduling): requests ranked by their
  question's arrival at the router, the oldest first, so a question's aggregators and final
  agent do not wait behind newer questions' leaves, and its warm-ups go before theirs.

The question's arrival number is the router's own count (RouterContext), so a client cannot
claim a better place. Values stay below 2**53 (exact in JSON everywhere).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from sglang_ext import protocol as P

# Values per class: a critical request's value is above every warm-up's for 2**40 questions.
CLASS_SPAN = 1 << 40


@dataclass(slots=True)
class RequestOrder:
    """`workflow`: rank by question (else FCFS). `question` numbers come from `next_question`."""

    workflow: bool = False
    _questions: itertools.count = field(default_factory=itertools.count, compare=False)

    def next_question(self) -> int:
        """The arrival number of a new question (0, 1, 2, ...)."""
        return next(self._questions)

    def value(self, critical: bool, question: int | None) -> int:
        """The `priority` field of a request of `question` (None: not known, FCFS's value)."""
        base = P.PRIORITY_CRITICAL if critical else P.PRIORITY_WARMUP
        if not self.workflow or question is None:
            return base
        return base * CLASS_SPAN - question
