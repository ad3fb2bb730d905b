"""Final-answer extraction per dataset, shared by the scorer (experiments.scoring grades with it)
and the shell router (DMV and aggregator bypass vote on it): `extract_answer(dataset, text)`
returns a canonical string, so two outputs with the same answer compare equal. One module per
dataset family; the competition-math one (math-verify, sympy) is imported only when used.
"""

from __future__ import annotations

from router.answers import bbh, generic, gsm8k, mcq

MATH_DATASETS = frozenset({"math500", "aime2025", "hmmt_feb_2025"})
# Datasets whose outputs have no single final answer to compare (instruction following).
NO_ANSWER_DATASETS = frozenset({"ifbench"})


def has_answer(dataset: str) -> bool:
    """Whether outputs on `dataset` carry a final answer that voting can compare."""
    return dataset not in NO_ANSWER_DATASETS


def extract_answer(dataset: str, text: str, task: str | None = None) -> str | None:
    """The canonical final answer in `text`, or None. `task` is the BBH task (answer format);
    without it BBH answers are read as option letters or normalized text. IFBench has no
    answer to extract and always gives None. A dataset the project does not know (a JSONL
    file) gets the generic extractor: a box, the answer line, or the last line."""
    if dataset == "gsm8k":
        return gsm8k.extract(text)
    if dataset in MATH_DATASETS:
        from router.answers import math

        return math.extract(text)
    if dataset == "mmlu_prox_lite":
        return mcq.extract_letter(text)
    if dataset == "bbh":
        return bbh.extract(task or "", text)
    if dataset in NO_ANSWER_DATASETS:
        return None
    return generic.extract(text)
