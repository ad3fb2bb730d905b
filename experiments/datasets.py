"""Benchmark questions: load a vendored test split (or any JSONL) as `Question`s.

Called by the experiment runner, the prompt builders and the scorers; reads only local files.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from experiments import gpqa, humaneval_data

logger = logging.getLogger(__name__)

DATASETS: tuple[str, ...] = (
    "gsm8k",
    "math500",
    "aime2025",
    "hmmt_feb_2025",
    "mmlu_prox_lite",
    "ifbench",
    "bbh",
    "mmlu",
    "gpqa_diamond",
    "humaneval",
    "humaneval_plus",
)
# Not shipped (their terms or their release channel): read from the user's file, see
# experiments/gpqa.py and experiments/humaneval_data.py.
USER_FILE_DATASETS = frozenset({"gpqa_diamond", "humaneval_plus"})

_REQUIRED = ("id", "question")


@dataclass(frozen=True, slots=True)
class Question:
    """One benchmark item. `extra` holds the dataset's own fields (choices, task, kwargs...)."""

    id: str
    question: str
    answer: str | None
    dataset: str
    # A dict is unhashable: leave it out of the hash so questions can key dicts and sets.
    extra: dict[str, Any] = field(default_factory=dict, hash=False)


def data_dir() -> Path:
    """The folder holding the vendored splits (`experiments/data/<name>/test.jsonl`)."""
    return Path(__file__).resolve().parent / "data"


def default_cache_dir() -> Path:
    """Arrow cache for `datasets`, under the repository's git-ignored `.cache/`."""
    return Path(__file__).resolve().parents[1] / ".cache" / "hf_datasets"


def resolve(name_or_path: str) -> tuple[str, Path]:
    """Map a dataset name or a file path to (dataset name, file); raise ValueError if neither."""
    if name_or_path == "gpqa_diamond":
        return name_or_path, gpqa.configured_path()
    if name_or_path == "humaneval_plus":
        return name_or_path, humaneval_data.configured_path()
    if name_or_path in DATASETS:
        path = data_dir() / name_or_path / "test.jsonl"
        if not path.is_file():
            raise ValueError(
                f"dataset {name_or_path!r}: vendored file {path} is missing; "
                "restore experiments/data/ from git"
            )
        return name_or_path, path
    path = Path(name_or_path)
    looks_like_path = path.suffix in (".jsonl", ".json", ".csv", ".gz") or os.sep in name_or_path
    if not looks_like_path:
        raise ValueError(
            f"unknown dataset {name_or_path!r}: use one of {', '.join(DATASETS)} "
            "or a path to a .jsonl file with 'id' and 'question' fields (or to GPQA's CSV, "
            "or to a HumanEval/EvalPlus .jsonl[.gz])"
        )
    if not path.is_file():
        raise ValueError(f"dataset file {path} does not exist")
    if path.suffix == ".csv":
        if not gpqa.is_gpqa_csv(path):
            raise ValueError(
                f"{path}: a .csv dataset must be GPQA's official CSV (columns "
                f"{', '.join(gpqa.COLUMNS)}...); other datasets are JSONL"
            )
        return "gpqa_diamond", path
    return humaneval_data.file_dataset(path) or path.stem, path


def load_questions(
    name_or_path: str,
    num_samples: int | None = None,
    cache_dir: str | Path | None = None,
    shuffle_seed: int | None = None,
    offset: int = 0,
) -> list[Question]:
    """Load a split through HF `datasets` (offline, local JSON); `num_samples` rows from row
    `offset` on, of the file's order or of a seeded shuffle of it (`shuffle_seed`: a split
    sorted by subject, as MMLU's is, then yields a sample spanning its subjects, and two
    offsets of one seed give disjoint sets, e.g. a scorer's training and held-out questions)."""
    if num_samples is not None and num_samples < 0:
        raise ValueError(f"num_samples must be >= 0 or None, got {num_samples}")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    if "," in name_or_path:
        mixed = interleaved(mix_members(name_or_path), cache_dir, shuffle_seed)
        if offset and offset >= len(mixed):
            raise ValueError(
                f"dataset {name_or_path!r}: offset {offset} skips all of its {len(mixed)} "
                f"questions; use an offset below {len(mixed)}"
            )
        return mixed[offset : None if num_samples is None else offset + num_samples]
    name, path = resolve(name_or_path)
    if name == "gpqa_diamond":
        rows = gpqa.read_rows(path)
    elif humaneval_data.file_dataset(path):
        rows = humaneval_data.read_rows(path)
    else:
        rows = _read_rows(path, cache_dir or default_cache_dir())
    if offset and offset >= len(rows):
        raise ValueError(
            f"dataset {name!r}: offset {offset} skips all of its {len(rows)} questions; "
            f"use an offset below {len(rows)}"
        )
    indexed = list(enumerate(rows))
    if shuffle_seed is not None:
        order = np.random.default_rng(shuffle_seed).permutation(len(indexed))
        indexed = [indexed[i] for i in order]
    end = None if num_samples is None else offset + num_samples
    # A question keeps its index in the file: ids that fall back to it stay the same however
    # the questions were drawn.
    return [_to_question(row, i, name, path) for i, row in indexed[offset:end]]


def mix_members(spec: str) -> list[str]:
    """The datasets of a mix `a,b,c` (names or paths), each once; ValueError naming what is
    wrong."""
    members = [m.strip() for m in spec.split(",")]
    if any(not m for m in members) or len(set(members)) != len(members) or len(members) < 2:
        raise ValueError(
            f"dataset mix {spec!r}: name two or more different datasets, comma-separated "
            "(e.g. gsm8k,mmlu,humaneval)"
        )
    for m in members:
        resolve(m)  # an unknown name or a missing file fails here, naming it
    return members


def interleaved(
    members: list[str], cache_dir: str | Path | None, shuffle_seed: int | None
) -> list[Question]:
    """A mixed-domain set: each member's questions (in its file's order, or its seeded shuffle),
    taken one from each member in turn until all are used; a question keeps its own `dataset`
    (its prompt and grading) and id. So any `num_samples` from the start is balanced across the
    members, and two offsets of one seed are disjoint sets, as for one dataset."""
    queues = [load_questions(m, None, cache_dir, shuffle_seed) for m in members]
    # A run's rows, its resume and its blocks key on the question id: ids must not repeat.
    seen: dict[str, str] = {}
    for member, qs in zip(members, queues, strict=True):
        for q in qs:
            if seen.setdefault(q.id, member) != member:
                raise ValueError(
                    f"dataset mix {','.join(members)}: {seen[q.id]} and {member} share question "
                    f"ids ({q.id!r}); mix datasets whose ids differ"
                )
    out: list[Question] = []
    for i in range(max(len(q) for q in queues)):
        out.extend(q[i] for q in queues if i < len(q))
    return out


def _read_rows(path: Path, cache_dir: str | Path) -> list[dict[str, Any]]:
    # Set before the first import of `datasets`: it reads these at import time. Local JSON never
    # needs the hub, and this keeps a stray lookup from hanging on a machine without network.
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    try:
        ds = datasets.load_dataset(
            "json", data_files=str(path), split="train", cache_dir=str(cache_dir)
        )
    except Exception as exc:  # datasets wraps JSON errors in several exception types
        raise ValueError(_describe_bad_file(path, exc)) from exc
    return ds.to_list()


def _describe_bad_file(path: Path, exc: Exception) -> str:
    """Find the first unreadable line ourselves: `datasets` errors do not name it."""
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                return f"{path}, line {lineno}: not valid JSON ({err.msg}); one object per line"
            if not isinstance(obj, dict):
                return f"{path}, line {lineno}: expected a JSON object, got {type(obj).__name__}"
    return f"{path}: could not be loaded as JSONL ({type(exc).__name__}: {exc})"


def _line_of(path: Path, index: int) -> int:
    """1-based line number of the index-th non-blank line (rows skip blank lines)."""
    seen = -1
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                seen += 1
                if seen == index:
                    return lineno
    return index + 1


def _to_question(row: dict[str, Any], index: int, name: str, path: Path) -> Question:
    for key in _REQUIRED:
        value = row.get(key)
        if value is None or (isinstance(value, str) and not value.strip()):
            raise ValueError(
                f"{path}, line {_line_of(path, index)}: row has no {key!r} "
                f"(every row needs non-empty 'id' and 'question'; 'answer' is optional)"
            )
    answer = row.get("answer")
    extra = {k: v for k, v in row.items() if k not in ("id", "question", "answer")}
    if "kwargs" in extra and isinstance(extra["kwargs"], list):
        # Arrow unifies the per-instruction kwargs dicts into one struct, filling keys a row
        # never had with None; drop them again (the official IFBench evaluator drops nulls too).
        extra["kwargs"] = [
            {k: v for k, v in (kw or {}).items() if v is not None} for kw in extra["kwargs"]
        ]
    return Question(
        id=str(row["id"]),
        question=str(row["question"]),
        answer=None if answer is None else str(answer),
        dataset=name,
        extra=extra,
    )
