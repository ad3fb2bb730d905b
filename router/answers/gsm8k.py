"""GSM8K answers: the final number of a response, commas, '$' and units stripped.

Called by `experiments.scoring` for dataset "gsm8k".
"""

from __future__ import annotations

from router.answers.numbers import canonical_number, final_number


def extract(text: str) -> str | None:
    """'The answer is $1,234.' -> '1234'; without a marker or box, the last number."""
    return final_number(text)


def grade(gold: str, text: str) -> tuple[bool, str | None]:
    pred = extract(text)
    want = canonical_number(gold)
    return pred is not None and pred == want, pred
