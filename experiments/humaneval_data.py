"""HumanEval-format code problems: the vendored HumanEval, or the user's EvalPlus HumanEval+ file.

Called by experiments.datasets. HumanEval+ (EvalPlus's release `HumanEvalPlus.jsonl.gz`)
is not shipped, since only its GitHub release holds it. It is read from MOA_PD_HUMANEVAL_PLUS_PATH
or from a `--dataset` path. Rows are read with `json` and not Arrow, because EvalPlus test inputs
mix types that one Arrow column cannot hold.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from experiments.user_files import user_file

ENV_VAR = "MOA_PD_HUMANEVAL_PLUS_PATH"
_REQUIRED = ("task_id", "prompt", "entry_point", "canonical_solution")

HOW_TO_GET = (
    "HumanEval+ is not shipped with moa-pd (EvalPlus publishes it only as a GitHub release "
    "file). Download https://github.com/evalplus/humanevalplus_release/releases/download/"
    "v0.1.10/HumanEvalPlus.jsonl.gz (what `evalplus` itself fetches), then set "
    "MOA_PD_HUMANEVAL_PLUS_PATH=/path/to/HumanEvalPlus.jsonl.gz and use "
    "`--dataset humaneval_plus`, or pass `--dataset /path/to/HumanEvalPlus.jsonl.gz`. "
    "`--dataset humaneval` (the original 164 problems, shipped) needs no download"
)


def configured_path() -> Path:
    """The file that MOA_PD_HUMANEVAL_PLUS_PATH names (experiments/user_files.py)."""
    return user_file("humaneval_plus", ENV_VAR, HOW_TO_GET)


def _open(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def file_dataset(path: Path) -> str | None:
    """`humaneval_plus` or `humaneval` when the file's first row is in HumanEval/EvalPlus form
    (task_id, prompt, entry_point...; `plus_input` for EvalPlus), else None."""
    try:
        with _open(path) as f:
            first = next((line for line in f if line.strip()), "")
        row = json.loads(first)
    except (OSError, ValueError, EOFError):
        return None
    if not isinstance(row, dict) or not all(k in row for k in _REQUIRED) or "id" in row:
        return None
    return "humaneval_plus" if "plus_input" in row else "humaneval"


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Normalized rows of a HumanEval or EvalPlus file, in file order."""
    rows = []
    with _open(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}, line {lineno}: not valid JSON ({err.msg})") from err
            missing = [k for k in _REQUIRED if not isinstance(rec, dict) or k not in rec]
            if missing:
                raise ValueError(
                    f"{path}, line {lineno}: not a HumanEval/EvalPlus row, it lacks "
                    f"{', '.join(missing)}. {HOW_TO_GET}"
                )
            rows.append(normalize(rec))
    if not rows:
        raise ValueError(f"{path}: no problems in the file. {HOW_TO_GET}")
    return rows


def normalize(rec: dict[str, Any]) -> dict[str, Any]:
    """The project's row shape: id/question/answer plus the fields the scorer runs."""
    row = {
        "id": rec["task_id"],
        "question": rec["prompt"],
        "answer": None,  # graded by running tests, not by comparing an answer
        "entry_point": rec["entry_point"],
        "canonical_solution": rec["canonical_solution"],
        "test": rec.get("test", ""),
    }
    for key in ("base_input", "plus_input", "atol"):
        if key in rec:
            row[key] = rec[key]
    return row
