"""MMLU (vendored subset), GPQA Diamond (the user's CSV, here a synthetic one in the official
format), HumanEval and HumanEval+ (the user's EvalPlus file, here a synthetic one): loading,
row counts, option shuffling, prompts, clear errors, and the scoring of known answers."""

from __future__ import annotations

import collections
import csv
import gzip
import json

import pytest

from experiments import gpqa, humaneval_data
from experiments.datasets import load_questions, resolve
from experiments.prompts import build_question_prompt
from experiments.scoring import extract_answer, score

# The official gpqa_diamond.csv header, abridged: the loader must pick "Question", not the
# "Pre-Revision" columns, and ignore the rest.
GPQA_HEADER = [
    "Pre-Revision Question",
    "Pre-Revision Correct Answer",
    "Pre-Revision Incorrect Answer 1",
    "Pre-Revision Incorrect Answer 2",
    "Pre-Revision Incorrect Answer 3",
    "Question",
    "Correct Answer",
    "Incorrect Answer 1",
    "Incorrect Answer 2",
    "Incorrect Answer 3",
    "Explanation",
    "Subdomain",
    "Record ID",
    "High-level domain",
]


def _gpqa_csv(path, n: int = 3):
    with path.open("w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(GPQA_HEADER)
        for i in range(n):
            w.writerow(
                ["old?", "old", "o1", "o2", "o3", f"Synthetic question {i}?", f"right {i}\n"]
                + [f"wrong {i}.{k}" for k in (1, 2, 3)]
                + ["because", "Quantum Mechanics", f"rec{i:03d}", "Physics"]
            )
    return path


def test_mmlu_is_100_per_subject_with_letter_answers() -> None:
    qs = load_questions("mmlu")
    per = collections.Counter(q.extra["subject"] for q in qs)
    assert len(per) == 57 and set(per.values()) == {100}
    assert all(q.answer == "ABCD"[q.extra["answer_index"]] for q in qs)
    first = next(q for q in qs if q.id == "mmlu-abstract_algebra-0000")
    assert first.answer == "B" and first.extra["choices"][1] == "4"


def test_mmlu_prompt_and_scoring() -> None:
    q = load_questions("mmlu", num_samples=1)[0]
    prompt = build_question_prompt(q)
    assert f"D. {q.extra['choices'][3]}" in prompt and "E. " not in prompt
    assert score(q, f"... so The answer is ({q.answer}).").correct is True
    wrong = "ABCD"[("ABCD".index(q.answer) + 1) % 4]
    assert score(q, f"The answer is {wrong}.").correct is False
    assert extract_answer("mmlu", "The answer is (E).") is None  # only four options


def test_gpqa_loads_from_the_env_path_with_a_seeded_recorded_shuffle(tmp_path, monkeypatch, caplog):
    path = _gpqa_csv(tmp_path / "gpqa_diamond.csv")
    monkeypatch.setenv(gpqa.ENV_VAR, str(path))
    qs = load_questions("gpqa_diamond")
    assert "has 3 questions, not GPQA Diamond's 198" in caplog.text
    assert [q.id for q in qs] == [
        "gpqa_diamond-rec000",
        "gpqa_diamond-rec001",
        "gpqa_diamond-rec002",
    ]
    for i, q in enumerate(qs):
        perm = q.extra["permutation"]
        assert sorted(perm) == [0, 1, 2, 3] and q.question == f"Synthetic question {i}?"
        assert q.extra["choices"][perm.index(0)] == f"right {i}"  # stripped, at the answer letter
        assert q.answer == "ABCD"[perm.index(0)]
        assert q.extra["domain"] == "Physics" and q.extra["subdomain"] == "Quantum Mechanics"
    again = load_questions(str(path))  # a path works too, and the shuffle is the same
    assert [q.extra["permutation"] for q in again] == [q.extra["permutation"] for q in qs]
    assert len({tuple(q.extra["permutation"]) for q in _many(tmp_path)}) > 1  # not one fixed order
    q = qs[0]
    assert score(q, f"The answer is ({q.answer})").correct is True
    assert "A. " in build_question_prompt(q) and "D. " in build_question_prompt(q)


def _many(tmp_path):
    return load_questions(str(_gpqa_csv(tmp_path / "many.csv", n=12)))


def test_gpqa_without_a_file_says_where_to_get_it(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(gpqa.ENV_VAR, raising=False)
    with pytest.raises(ValueError, match="MOA_PD_GPQA_PATH is not set.*idavidrein/gpqa"):
        load_questions("gpqa_diamond")
    monkeypatch.setenv(gpqa.ENV_VAR, str(tmp_path / "none.csv"))
    with pytest.raises(ValueError, match="none.csv is not a file"):
        resolve("gpqa_diamond")
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="must be GPQA's official CSV"):
        load_questions(str(other))


def test_humaneval_rows_and_prompt() -> None:
    qs = load_questions("humaneval")
    assert [q.id for q in qs[:2]] == ["HumanEval/0", "HumanEval/1"] and len(qs) == 164
    q = qs[0]
    assert q.answer is None and q.extra["entry_point"] == "has_close_elements"
    assert "def check(candidate)" in q.extra["test"]
    prompt = build_question_prompt(q)
    assert q.question in prompt and "```python" in prompt
    assert extract_answer("humaneval", "```python\nx\n```") is None  # nothing to vote on


def _evalplus_file(tmp_path):
    """Two EvalPlus rows in the release's shape (HumanEvalPlus.jsonl.gz)."""
    rows = [
        {
            "task_id": "HumanEval/2",
            "prompt": 'def truncate_number(number: float) -> float:\n    """Decimals."""\n',
            "entry_point": "truncate_number",
            "canonical_solution": "    return number % 1.0\n",
            "contract": "",
            "base_input": [[3.5], [1.33]],
            "plus_input": [[123.456], [0.0001]],
            "atol": 1e-06,
        },
        {
            "task_id": "HumanEval/53",
            "prompt": 'def add(x: int, y: int):\n    """Add."""\n',
            "entry_point": "add",
            "canonical_solution": "    return x + y\n",
            "contract": "",
            "base_input": [[0, 1], [5, 7]],
            "plus_input": [[-3, 10**20]],
            "atol": 0,
        },
    ]
    path = tmp_path / "HumanEvalPlus.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return path


def test_humaneval_plus_from_the_users_file(tmp_path, monkeypatch) -> None:
    path = _evalplus_file(tmp_path)
    monkeypatch.delenv(humaneval_data.ENV_VAR, raising=False)
    with pytest.raises(ValueError, match="MOA_PD_HUMANEVAL_PLUS_PATH is not set.*release"):
        load_questions("humaneval_plus")
    monkeypatch.setenv(humaneval_data.ENV_VAR, str(path))
    qs = load_questions("humaneval_plus")
    assert [q.dataset for q in qs] == ["humaneval_plus"] * 2
    assert qs[1].extra["plus_input"] == [[-3, 10**20]]
    assert [q.dataset for q in load_questions(str(path))] == ["humaneval_plus"] * 2
    trunc, add = qs
    assert score(
        trunc, "```python\ndef truncate_number(number):\n    return number - int(number)\n```"
    ).correct
    # Right on the base inputs, wrong on the plus input: HumanEval+ catches it.
    sloppy = "```python\ndef add(x, y):\n    return x + y if y < 100 else 0\n```"
    s = score(add, sloppy)
    assert s.correct is False and "input 2" in s.details["stderr_tail"]
