"""Answer extraction and grading for every benchmark: `extract_answer` and `score`.

Called by the experiment runner (accuracy) and the early-exit voter (`extract_answer` returns a
canonical string, so equal answers compare equal). One module per dataset family.
"""

from __future__ import annotations

from experiments.datasets import Question
from experiments.scoring import bbh, generic, gsm8k, ifbench, math, mcq
from experiments.scoring.ifbench.registry import coverage as ifbench_coverage
from experiments.scoring.score import Score

__all__ = ["MATH_DATASETS", "Score", "extract_answer", "ifbench_coverage", "score"]

MATH_DATASETS = frozenset({"math500", "aime2025", "hmmt_feb_2025"})


def extract_answer(dataset: str, text: str, task: str | None = None) -> str | None:
    """The canonical final answer in `text`, or None. `task` is the BBH task (answer format);
    without it BBH answers are read as option letters or normalized text. IFBench has no
    answer to extract and always gives None."""
    if dataset == "gsm8k":
        return gsm8k.extract(text)
    if dataset in MATH_DATASETS:
        return math.extract(text)
    if dataset == "mmlu_prox_lite":
        return mcq.extract_letter(text)
    if dataset == "bbh":
        return bbh.extract(task or "", text)
    if dataset == "ifbench":
        return None
    return generic.extract(text)


def score(q: Question, output_text: str) -> Score:
    """Grade one output. `correct` is None when there is nothing to grade against."""
    name = q.dataset
    if name == "ifbench" or "instruction_id_list" in q.extra:
        return ifbench.score_response(
            list(q.extra.get("instruction_id_list", [])),
            list(q.extra.get("kwargs", [])),
            output_text,
        )
    if q.answer is None:
        return Score(None, extract_answer(name, output_text), {"reason": "no gold answer"})
    if name == "gsm8k":
        ok, got = gsm8k.grade(q.answer, output_text)
    elif name in MATH_DATASETS:
        ok, got = math.grade(q.answer, output_text)
    elif name == "mmlu_prox_lite":
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
