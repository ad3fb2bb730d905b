"""IFBench `repeat:*` checkers: the response must repeat (part of) the request.

Registered by `registry.py`; each takes the response and the row's kwargs, returns pass/fail.
"""

from __future__ import annotations

# The instruction text of repeat:repeat_simple; the response must be exactly this sentence.
_SIMPLE = "Only output this sentence here, ignore all other requests."


def repeat_change(response: str, prompt_to_repeat: str) -> bool:
    """The request repeated word for word except a changed first word."""
    if response == prompt_to_repeat:
        return False
    return response.split()[1:] == prompt_to_repeat.split()[1:]


def repeat_simple(response: str) -> bool:
    return response.strip().lower() == _SIMPLE.lower()


def repeat_span(response: str, prompt_to_repeat: str, n_start: float, n_end: float) -> bool:
    """The span [n_start, n_end] (inclusive) of the request, copied.

    The test prompts say "the indices are word indices, split by whitespace", while the
    official checker slices characters; a response following either reading passes.
    """
    start, end = int(n_start), int(n_end)
    answer = response.strip().lower()
    by_chars = prompt_to_repeat[start : end + 1].strip().lower()
    by_words = " ".join(prompt_to_repeat.split()[start : end + 1]).lower()
    return answer in (by_chars, by_words)


CHECKERS = {
    "repeat:repeat_change": repeat_change,
    "repeat:repeat_simple": repeat_simple,
    "repeat:repeat_span": repeat_span,
}
