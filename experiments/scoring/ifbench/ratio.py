"""IFBench `ratio:*` checkers: proportions (trigram overlap, stop words, sentence types/lengths).

Registered by `registry.py`; each takes the response and the row's kwargs, returns pass/fail.
"""

from __future__ import annotations

from experiments.scoring.ifbench.text import count_stopwords, count_words, sentences


def _trigrams(text: str) -> set[str]:
    return {text[i : i + 3] for i in range(len(text) - 2)}


def overlap(response: str, reference_text: str, percentage: float) -> bool:
    """Share of the response's character trigrams found in the reference, within ±2 points.

    Character trigrams, not word trigrams: the official checker passes the raw strings to
    `nltk.ngrams`, which iterates characters; we match it so scores stay comparable.
    """
    mine = _trigrams(response)
    if not mine:
        return False
    share = 100 * len(mine & _trigrams(reference_text)) / len(mine)
    return percentage - 2 <= share <= percentage + 2


def _endings(response: str) -> tuple[int, int, int]:
    sents = sentences(response)
    return tuple(sum(1 for s in sents if s.endswith(end)) for end in (".", "?", "!"))


def sentence_balance(response: str) -> bool:
    """As many declarative (.) as interrogative (?) as exclamatory (!) sentences."""
    decl, inter, excl = _endings(response)
    return decl == inter == excl


def sentence_type(response: str) -> bool:
    """Declarative (.) to interrogative (?) sentences exactly 2:1."""
    decl, inter, _ = _endings(response)
    return decl == 2 * inter


def sentence_words(response: str) -> bool:
    """Exactly three sentences of the same character length. (The instruction also asks for
    all-different words; the official checker does not test that, and neither do we.)"""
    sents = sentences(response)
    return len(sents) == 3 and len({len(s.strip()) for s in sents}) == 1


def stop_words(response: str, percentage: float) -> bool:
    """Stop words are at most `percentage` % of all words."""
    total = count_words(response)
    return total > 0 and 100 * count_stopwords(response) / total <= percentage


CHECKERS = {
    "ratio:overlap": overlap,
    "ratio:sentence_balance": sentence_balance,
    "ratio:sentence_type": sentence_type,
    "ratio:sentence_words": sentence_words,
    "ratio:stop_words": stop_words,
}
