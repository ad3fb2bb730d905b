"""Dynamic majority voting (DMV) over a cluster's extracted answers, and the aggregator-bypass
choice (MOSAIC's adaptive aggregation). Pure functions on plain lists; `router.early_exit.decide`
calls `vote` for `early_exit.method: dmv`, the orchestrator calls `bypass_choice`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple


class Vote(NamedTuple):
    answer: str | None  # the most common normalized answer among the completed (None: no answers)
    count: int  # completed agents that gave it
    planned: int  # agents planned in the cluster (the electorate)

    @property
    def share(self) -> float:
        """Fraction of the planned agents that agree on `answer`."""
        return self.count / self.planned if self.planned else 0.0

    @property
    def majority(self) -> bool:
        """A strict majority of the *planned* agents agree, so no outstanding vote can change it."""
        return self.answer is not None and 2 * self.count > self.planned


def normalize_answer(answer: str | None) -> str | None:
    """A comparable form of an extracted answer: "18", "18.0", " 18. " all become "18".

    The dataset's extractor does the real work; this only removes formatting noise so that two
    extractions of the same value vote together. Empty answers are None (they never agree).
    """
    if answer is None:
        return None
    text = " ".join(str(answer).split()).strip().rstrip(".").casefold()
    if not text:
        return None
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return text
    if not math.isfinite(value):
        return text
    return str(int(value)) if value.is_integer() else repr(value)


def vote(answers: Sequence[str | None], planned: int) -> Vote:
    """Tally the completed agents' answers against the planned size of the cluster.

    Ties between equally common answers go to the one that was given first (completion order).
    """
    if planned < len(answers):
        raise ValueError(
            f"planned={planned} is smaller than the {len(answers)} completed answers; pass the "
            "number of agents planned in the cluster"
        )
    normalized = [a for a in map(normalize_answer, answers) if a is not None]
    if not normalized:
        return Vote(None, 0, planned)
    counts = Counter(normalized)
    best = max(counts.values())
    winner = next(a for a in normalized if counts[a] == best)
    return Vote(winner, best, planned)


def consensus_agent(
    agent_ids: Sequence[str], answers: Sequence[str | None], confidences: Sequence[float]
) -> str | None:
    """The agent whose output stands for the cluster: among the agents giving a most common answer
    (all agents when no answer was extracted), the most confident; ties go to the first."""
    if not agent_ids:
        return None
    if not len(agent_ids) == len(answers) == len(confidences):
        raise ValueError("agent_ids, answers and confidences must have one entry per agent")
    normalized = [normalize_answer(a) for a in answers]
    counts = Counter(a for a in normalized if a is not None)
    top = max(counts.values(), default=0)
    pool = [i for i, a in enumerate(normalized) if top == 0 or counts.get(a, 0) == top]
    best = max(pool, key=lambda i: (confidences[i], -i))
    return agent_ids[best]


def bypass_choice(
    agent_ids: Sequence[str],
    answers: Sequence[str | None],
    confidences: Sequence[float],
    criterion: str,
    q: float | None = None,
    q_threshold: float = 0.9,
) -> str | None:
    """Whether to skip the successor: the id of the agent whose output is passed on, or None.

    criterion "answer": every completed output has the same non-empty answer (at least two
    outputs; one output agrees with nothing). criterion "q": the cluster's Q is at least
    `q_threshold`. Call it once the cluster is settled (all done, or early exit has fired).
    """
    if criterion == "answer":
        top = vote(answers, len(answers))
        if len(answers) < 2 or top.answer is None or top.count != len(answers):
            return None
    elif criterion == "q":
        if q is None or not math.isfinite(q) or q < q_threshold:
            return None
    else:
        raise ValueError(f"unknown aggregator_bypass criterion {criterion!r}; use 'answer' or 'q'")
    return consensus_agent(agent_ids, answers, confidences)
