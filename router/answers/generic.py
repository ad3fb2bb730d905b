"""Answers of a JSONL file the project does not know: a number, a box, or the answer line.

Called by `experiments.scoring` for any dataset name without a scorer of its own.
"""

from __future__ import annotations

import re

from router.answers.latex import last_boxed
from router.answers.numbers import canonical_number

_MARKER = re.compile(r"answer\s*(?:is|:)\s*:?", re.IGNORECASE)


def normalize(text: str) -> str | None:
    """A number in canonical form ('1,234.0' -> '1234'), else case-folded text without the
    surrounding punctuation, markdown and '$'."""
    s = text.replace("**", "").replace("$", "").strip()
    s = re.sub(r"^\\text\{(.*)\}$", r"\1", s).strip(" .,:;!\"'`()[]").strip()
    if not s:
        return None
    number = canonical_number(s)
    return number if number is not None else re.sub(r"\s+", " ", s.casefold())


def extract(text: str) -> str | None:
    """The last \\boxed{}, else the rest of the last 'answer is' line, else the last line."""
    boxed = last_boxed(text)
    if boxed is not None:
        return normalize(boxed)
    hits = list(_MARKER.finditer(text))
    if hits:
        return normalize(text[hits[-1].end() :].strip().split("\n")[0])
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return normalize(lines[-1]) if lines else None


def grade(gold: str, text: str) -> tuple[bool, str | None]:
    pred = extract(text)
    return pred is not None and pred == normalize(gold), pred
