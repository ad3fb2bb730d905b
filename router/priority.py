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

Within a question, the order its agents start in (`start_order`): every first-layer agent's
request goes out at once, so this is the order its prefill worker queues them, and a leaf's
prefill waits for those before it. With `critical_path_first` the agent with the longest
remaining path (router/topology.remaining_path: its decode budget plus its successors') starts
first, so the leaf the question waits for longest is not prefilled last; the config's order
otherwise, and always where early exit or aggregator bypass decide at each completion, since
there the first completions (the paper's fastest-first order) are what shortens the question.
Off by default (`cluster.json` start_order): on a CPU it helped pipelined at concurrency 1 and
lost at 4 (docs/benchmarks.md, stop 44).
The simulator starts a question's agents with the same function (simulation/question.py).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from router.topology import remaining_path
from sglang_ext import protocol as P

if TYPE_CHECKING:
    from router.config import TopologyConfig

# Values per class: a critical request's value is above every warm-up's for 2**40 questions.
CLASS_SPAN = 1 << 40


@dataclass(slots=True)
class RequestOrder:
    """`workflow`: rank by question (else FCFS). `question` numbers come from `next_question`.
    `critical_path_first`: a question's agents start by `start_order`'s rule."""

    workflow: bool = False
    critical_path_first: bool = False
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


def start_order(
    cfg: TopologyConfig, critical_path_first: bool, completion_driven: bool = False
) -> list[str]:
    """The ids of `cfg`'s agents in the order a question starts them: by remaining path, the
    longest first (the config's order among equals), when `critical_path_first` and not
    `completion_driven` (early exit or aggregator bypass on); else the config's order."""
    ids = [a.id for a in cfg.agents]
    if not critical_path_first or completion_driven:
        return ids
    path = remaining_path(cfg)
    return sorted(ids, key=lambda a: -path[a])  # a stable sort: config order among equals
