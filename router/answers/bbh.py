"""BIG-Bench Hard answers: per-task extraction and normalized exact match.

Called by `experiments.scoring` for dataset "bbh"; the task name comes from `Question.extra`.
"""

from __future__ import annotations

import re

from router.answers.mcq import extract_letter
from router.answers.numbers import final_number

# Task -> the closed vocabulary of its answers; other tasks are options, numbers or free text.
_BINARY = {
    "boolean_expressions": ("true", "false"),
    "causal_judgement": ("yes", "no"),
    "navigate": ("yes", "no"),
    "sports_understanding": ("yes", "no"),
    "web_of_lies": ("yes", "no"),
    "formal_fallacies": ("valid", "invalid"),
}
_NUMERIC = frozenset({"multistep_arithmetic_two", "object_counting"})
_MARKER = re.compile(r"answer\s*(?:is|:)\s*:?", re.IGNORECASE)
_OPTION_LINE = re.compile(r"^\(([A-Z])\)\s*(.+?)\s*$", re.MULTILINE)


def answer_span(text: str) -> tuple[str, bool]:
    """(text after the last 'answer is' / 'Answer:' to the line end, True), else (last line,
    False)."""
    hits = list(_MARKER.finditer(text))
    if hits:
        span = text[hits[-1].end() :].strip().split("\n")[0]
    else:
        lines = [ln for ln in text.strip().splitlines() if ln.strip()]
        span = lines[-1] if lines else ""
    return span.strip().strip("*").strip().rstrip(".").strip("*").strip(), bool(hits)


def normalize(text: str) -> str:
    """Case-fold, drop markdown/quotes/trailing punctuation, collapse spaces."""
    s = text.replace("**", "").replace("`", "").replace("$", "").strip().casefold()
    s = s.strip(" .,:;!\"'")
    return re.sub(r"\s+", " ", s)


def _option_letter(text: str) -> str | None:
    """'(B)', 'B', '(b)' -> '(B)'."""
    m = re.fullmatch(r"\(?([A-Za-z])\)?", text.strip())
    return f"({m.group(1).upper()})" if m else None


def extract(task: str, text: str) -> str | None:
    """Canonical answer for `task`: '(B)', 'true', '42', '] ) >', or normalized text."""
    span, marked = answer_span(text)
    if task in _BINARY:
        words = re.findall(r"[a-z]+", span.casefold())
        found = [w for w in words if w in _BINARY[task]]
        if not found:  # no marker line: the last vocabulary word anywhere
            found = [w for w in re.findall(r"[a-z]+", text.casefold()) if w in _BINARY[task]]
            found = found[-1:]
        return found[0] if found else None
    if task in _NUMERIC:
        return final_number(span) or final_number(text)
    if task == "dyck_languages":
        brackets = re.findall(r"[()\[\]{}<>]", span)
        return " ".join(brackets) or None
    if task == "word_sorting":
        return " ".join(re.findall(r"[a-z0-9'&-]+", span.casefold())) or None
    # Option tasks: a letter on the answer line; without an answer line, anywhere in the text.
    # Failing both, the answer text itself (3 gold answers are option text, not letters).
    letter = _option_letter(span) or _letter_in(span) or (None if marked else _letter_in(text))
    return letter or normalize(span) or None


def _letter_in(text: str) -> str | None:
    letter = extract_letter(text, n_choices=26)
    return f"({letter})" if letter else None


def canonical_gold(task: str, gold: str) -> str:
    """The gold answer in the form `extract` returns."""
    return extract(task, f"The answer is {gold}.") or normalize(gold)


def options(question: str) -> dict[str, str]:
    """'(A) text' lines of a question -> {'(A)': 'text'}."""
    return {f"({m.group(1)})": m.group(2) for m in _OPTION_LINE.finditer(question)}


def grade(task: str, gold: str, question: str, text: str) -> tuple[bool, str | None]:
    """(correct, extracted). An option letter and its option text count as the same answer."""
    pred = extract(task, text)
    if pred is None:
        return False, None
    want = canonical_gold(task, gold)
    if pred == want:
        return True, pred
    opts = options(question)
    if pred in opts:  # letter answered, gold is text (3 rows whose options were split on commas)
        return normalize(opts[pred]) == normalize(gold), pred
    if want in opts:  # text answered, gold is a letter
        return pred == normalize(opts[want]), pred
    return False, pred
