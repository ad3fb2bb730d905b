"""Answer extraction and grading for every benchmark: `extract_answer` and `score`.

Called by the experiment runner (accuracy). The extractors live in `router.answers`, so the
shell router's majority vote reads answers exactly as this scorer grades them.
"""

from __future__ import annotations

from experiments.datasets import Question
from experiments.scoring import humaneval, ifbench
from experiments.scoring.ifbench.registry import coverage as ifbench_coverage
from experiments.scoring.score import Score
from router.answers import (
    MATH_DATASETS,
    MCQ_DATASETS,
    bbh,
    extract_answer,
    generic,
    gsm8k,
    math,
    mcq,
)

__all__ = ["MATH_DATASETS", "Score", "extract_answer", "ifbench_coverage", "score"]


def score(q: Question, output_text: str) -> Score:
    """Grade one output. `correct` is None when there is nothing to grade against."""
    name = q.dataset
    if name == "ifbench" or "instruction_id_list" in q.extra:
        return ifbench.score_response(
            list(q.extra.get("instruction_id_list", [])),
            list(q.extra.get("kwargs", [])),
            output_text,
        )
    if name in ("humaneval", "humaneval_plus"):
        return humaneval.score(q, output_text)  # runs the tests in a sandboxed process
    if q.answer is None:
        return Score(None, extract_answer(name, output_text), {"reason": "no gold answer"})
    if name == "gsm8k":
        ok, got = gsm8k.grade(q.answer, output_text)
    elif name in MATH_DATASETS:
        ok, got = math.grade(q.answer, output_text)
    elif name in MCQ_DATASETS:
        ok, got = _grade_mcq(q, output_text)
    elif name == "bbh":
        ok, got = bbh.grade(q.extra.get("task", ""), q.answer, q.question, output_text)
    else:
        ok, got = generic.grade(q.answer, output_text)
    return Score(correct=ok, extracted=got, details={"gold": q.answer})


def _grade_mcq(q: Question, text: str) -> tuple[bool, str | None]:
    choices = list(q.extra.get("choices") or [])
    letter = mcq.extract_letter(text, n_choices=len(choices) or None)
    if letter is None and choices:
        letter = mcq.letter_by_text(text, choices)
    return letter is not None and letter == q.answer.strip().upper(), letter
