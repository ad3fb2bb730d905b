"""Multiple-choice answers (MMLU, MMLU-ProX-Lite, GPQA, BBH option tasks): find the chosen letter.

Called by `experiments.scoring` and the BBH scorer; returns one upper-case letter or None.
"""

from __future__ import annotations

import re

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

# Explicit answers: "The answer is (B)", "Answer: **B**", "correct option is B", "\boxed{B}".
# The letter is upper-case only, so "the answer is a ..." (the article) never reads as A.
_STRONG = (
    re.compile(
        r"(?i:answer|option|choice)\s*(?i:is|would be|should be|:)?\s*:?\s*"
        r"(?i:option|choice|letter)?\s*"
        r"(?P<wrap>[*_(\[{$\s]*)"
        r"(?P<letter>[A-Z])(?![A-Za-z0-9])"
    ),
    re.compile(r"\\boxed\{\s*(?:\\text\{)?\s*\(?(?P<letter>[A-Z])\)?\s*\}?\s*\}"),
)
# Words that follow an answer letter in prose ("A is correct"), unlike "I think" or "a bit".
_AFTER_LETTER = frozenset({"is", "because", "since", "as", "and", "or", "was", "would"})
# Weaker signs, used when no explicit answer is found; the one latest in the text wins.
_WEAK = (
    re.compile(r"\*\*\s*\(?(?P<letter>[A-Z])\)?(?:[.:)]|\*\*)"),  # **B**, **(B)**, **B.**
    re.compile(r"\((?P<letter>[A-Z])\)"),  # (B)
    re.compile(r"^\s*(?P<letter>[A-Z])\s*[.)]?\s*$", re.MULTILINE),  # a line that is only "B."
)


def extract_letter(text: str, n_choices: int | None = None) -> str | None:
    """The chosen option letter; letters past `n_choices` (default 10, A-J) are ignored."""
    valid = LETTERS[: n_choices or 10]
    for group in (_STRONG, _WEAK):
        best: tuple[int, str] | None = None
        for pattern in group:
            for m in pattern.finditer(text):
                letter = m.group("letter")
                if letter not in valid or _is_word(m, text):
                    continue
                if best is None or m.start("letter") > best[0]:
                    best = (m.start("letter"), letter)
        if best is not None:
            return best[1]
    return None


def _is_word(m: re.Match, text: str) -> bool:
    """'Answer: I think (E)', 'answer is A bit': a bare I/A before a lower-case word is English."""
    if m.group("letter") not in "AI" or "wrap" not in m.groupdict() or m.group("wrap").strip():
        return False
    after = re.match(r"\s+([a-z]+)", text[m.end("letter") :])
    return after is not None and after.group(1) not in _AFTER_LETTER


def letter_by_text(text: str, choices: list[str]) -> str | None:
    """Letter of the one option whose full text ends the response (when no letter is given)."""
    lines = text.strip().splitlines()
    tail = _norm(lines[-1]) if lines else ""
    matches = [i for i, c in enumerate(choices) if _norm(c) and tail.endswith(_norm(c))]
    return LETTERS[matches[0]] if len(matches) == 1 else None


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", s.lower()).strip()
