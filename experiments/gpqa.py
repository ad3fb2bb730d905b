"""GPQA Diamond from the user's own copy of the official CSV (never shipped: see SOURCE note).

Called by experiments.datasets for `--dataset gpqa_diamond` (with MOA_PD_GPQA_PATH) or
`--dataset /path/gpqa_diamond.csv`. Each question's four options are shuffled with a
permutation seeded by its Record ID, recorded in the row, so every run asks the same order.
"""

from __future__ import annotations

import csv
import logging
import random
from pathlib import Path
from typing import Any

from experiments.user_files import user_file

logger = logging.getLogger(__name__)

ENV_VAR = "MOA_PD_GPQA_PATH"
DIAMOND_ROWS = 198
# The official CSV's columns that the loader needs (gpqa_diamond.csv in gpqa's dataset.zip).
COLUMNS = ("Record ID", "Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2")
_INCORRECT = ("Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
PERMUTATION_SEED = 0

HOW_TO_GET = (
    "GPQA is not shipped with moa-pd: its authors ask that the questions not be redistributed "
    "in plain text. Get dataset.zip from https://github.com/idavidrein/gpqa (the password is in "
    "its README) or the gated Hugging Face dataset Idavidrein/gpqa, and extract "
    "gpqa_diamond.csv; then set MOA_PD_GPQA_PATH=/path/to/gpqa_diamond.csv and use "
    "`--dataset gpqa_diamond`, or pass `--dataset /path/to/gpqa_diamond.csv`"
)


def configured_path() -> Path:
    """The file that MOA_PD_GPQA_PATH names (experiments/user_files.py)."""
    return user_file("gpqa_diamond", ENV_VAR, HOW_TO_GET)


def is_gpqa_csv(path: Path) -> bool:
    """Whether a .csv file has the official GPQA header (any of its splits)."""
    with path.open(encoding="utf-8", newline="") as f:
        header = next(csv.reader(f), [])
    return all(col in header for col in COLUMNS)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Normalized rows (id, question, answer letter, choices, permutation...) in file order."""
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in (*COLUMNS, _INCORRECT[2]) if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(
                f"{path}: not the official GPQA CSV, it lacks column(s) {', '.join(missing)}. "
                f"{HOW_TO_GET}"
            )
        rows = [_normalize(rec, line, path) for line, rec in enumerate(reader, start=2)]
    if not rows:
        raise ValueError(f"{path}: no questions in the file. {HOW_TO_GET}")
    if len(rows) != DIAMOND_ROWS:  # the main (448) or extended (546) set, or an edited copy
        logger.warning(
            "%s has %d questions, not GPQA Diamond's %d; results are not Diamond's",
            path,
            len(rows),
            DIAMOND_ROWS,
        )
    return rows


def _normalize(rec: dict[str, str], line: int, path: Path) -> dict[str, Any]:
    record_id = (rec.get("Record ID") or "").strip()
    options = [rec.get("Correct Answer") or ""] + [rec.get(c) or "" for c in _INCORRECT]
    options = [o.strip() for o in options]
    question = (rec.get("Question") or "").strip()
    if not record_id or not question or not all(options):
        raise ValueError(
            f"{path}, line {line}: a GPQA row needs a Record ID, a Question, a Correct Answer "
            "and three Incorrect Answers"
        )
    # permutation[i] = which original option (0 = the correct one) is shown as letter i.
    permutation = list(range(4))
    random.Random(f"gpqa:{record_id}:{PERMUTATION_SEED}").shuffle(permutation)
    return {
        "id": f"gpqa_diamond-{record_id}",
        "question": question,
        "answer": "ABCD"[permutation.index(0)],
        "choices": [options[i] for i in permutation],
        "permutation": permutation,
        "record_id": record_id,
        "domain": (rec.get("High-level domain") or "").strip(),
        "subdomain": (rec.get("Subdomain") or "").strip(),
    }
