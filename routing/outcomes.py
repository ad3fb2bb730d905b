"""What the scorer learns from: per question, which pool candidates answered it correctly, read
from the setting-#5 rows (`single_model`: the candidate's id) of one or more runs' results.jsonl.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from experiments.results import ResultsError, read_results

log = logging.getLogger(__name__)

SINGLE_SETTING = 5


class OutcomesError(ValueError):
    """Runs that cannot train a scorer: unreadable, no #5 rows, a candidate whose answers are all
    right or all wrong (found by routing.train, which needs both classes among the questions it
    trains on)."""


@dataclass(frozen=True)
class Outcomes:
    """`correct[i, j]`: question `keys[i]` answered correctly by `candidates[j]` (1.0 / 0.0),
    NaN where that candidate has no graded row for it."""

    keys: list[tuple[str, str]]  # (dataset, sample_id)
    candidates: list[str]
    correct: np.ndarray
    runs: list[str]
    ungraded: int  # #5 rows left out: failed or not gradable
    # tokens[i, j]: the output tokens candidates[j] wrote for question keys[i] (NaN: unknown,
    # e.g. a run that recorded no output ids); None: not read.
    tokens: np.ndarray | None = None


def results_file(run: str | Path) -> Path:
    """A run folder → its results.jsonl; a file → itself."""
    path = Path(run)
    return path / "results.jsonl" if path.is_dir() else path


def read_outcomes(runs: list[str | Path], skip: frozenset[str] = frozenset()) -> Outcomes:
    """The graded #5 rows of `runs`, but those of candidates in `skip`; a (question,
    candidate) seen in two runs keeps the later."""
    graded: dict[tuple[str, str], dict[str, bool]] = {}
    written: dict[tuple[str, str, str], int] = {}  # (dataset, sample_id, candidate) -> tokens
    ungraded = 0
    files = [results_file(r) for r in runs]
    for path in files:
        try:
            rows = read_results(path)
        except ResultsError as e:
            raise OutcomesError(str(e)) from None
        except (OSError, UnicodeDecodeError) as e:
            raise OutcomesError(
                f"{path}: cannot read it ({e}); name a run folder or its results.jsonl"
            ) from None
        single = [
            r
            for r in rows
            if r.setting == SINGLE_SETTING and r.single_model and r.single_model not in skip
        ]
        log.info("%s: %d setting-#5 rows of %d", path, len(single), len(rows))
        for r in single:
            if r.correct is None:
                ungraded += 1
                continue
            graded.setdefault((r.dataset, r.sample_id), {})[r.single_model] = r.correct
            ids = sum(len(a.output_ids) for a in r.agents.values())
            if ids:
                written[(r.dataset, r.sample_id, r.single_model)] = ids
    if not graded:
        raise OutcomesError(
            f"no graded setting-#5 rows in {', '.join(map(str, files))}; the scorer learns from "
            "each candidate answering alone: run `moa-pd run --settings 5 ...` first"
        )
    keys = sorted(graded)
    candidates = sorted({c for per in graded.values() for c in per})
    correct = np.full((len(keys), len(candidates)), np.nan)
    tokens = np.full_like(correct, np.nan)
    for i, k in enumerate(keys):
        for j, c in enumerate(candidates):
            if c in graded[k]:
                correct[i, j] = float(graded[k][c])
                tokens[i, j] = written.get((*k, c), np.nan)
    return Outcomes(keys, candidates, correct, [str(f) for f in files], ungraded, tokens)
