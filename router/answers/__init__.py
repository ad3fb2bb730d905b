"""Final-answer extraction per dataset, shared by the scorer (experiments.scoring grades with it)
and the shell router (DMV and aggregator bypass vote on it): `extract_answer(dataset, text)`
returns a canonical string, so two outputs with the same answer compare equal. One module per
dataset family; the competition-math one (math-verify, sympy) is imported only when used.
"""

from __future__ import annotations

from router.answers import bbh, generic, gsm8k, mcq

MATH_DATASETS = frozenset({"math500", "aime2025", "hmmt_feb_2025"})
# Multiple-choice datasets and their number of options (letters past it are not answers).
MCQ_DATASETS = {"mmlu_prox_lite": 10, "mmlu": 4, "gpqa_diamond": 4}
# Datasets whose outputs have no single final answer to compare: instruction following, and
# code, which is graded by running tests and not by comparing text.
NO_ANSWER_DATASETS = frozenset({"ifbench", "humaneval", "humaneval_plus"})


def has_answer(dataset: str) -> bool:
    """Whether outputs on `dataset` carry a final answer that voting can compare."""
    return dataset not in NO_ANSWER_DATASETS


def extract_answer(dataset: str, text: str, task: str | None = None) -> str | None:
    """The canonical final answer in `text`, or None. `task` is the BBH task (answer format);
    without it BBH answers are read as option letters or normalized text. IFBench has no
    answer to extract and always gives None,
    and neither does code (HumanEval). A dataset the project does not know (a JSONL
    file) gets the generic extractor: a box, the answer line, or the last line."""
    if dataset == "gsm8k":
        return gsm8k.extract(text)
    if dataset in MATH_DATASETS:
        from router.answers import math

        return math.extract(text)
    if dataset in MCQ_DATASETS:
        return mcq.extract_letter(text, n_choices=MCQ_DATASETS[dataset])
    if dataset == "bbh":
        return bbh.extract(task or "", text)
    if dataset in NO_ANSWER_DATASETS:
        return None
    return generic.extract(text)
