"""The result of scoring one model output against one question.

Built by every scorer in `experiments.scoring`; read by the experiment runner and reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Score:
    """`correct` is None when the output cannot be judged (e.g. no IFBench checker covers it)."""

    correct: bool | None
    extracted: str | None
    details: dict[str, Any] = field(default_factory=dict)
