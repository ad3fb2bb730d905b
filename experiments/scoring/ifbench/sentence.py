"""IFBench `sentence:*` checkers: per-sentence growth (alliteration, word count) and keywords.

Registered by `registry.py`; each takes the response and the row's kwargs, returns pass/fail.
"""

from __future__ import annotations

import itertools
import re

from experiments.scoring.ifbench.text import PUNCT, sentences, strip_punct


def _alliteration(sentence: str) -> int:
    """Length-weighted run score: a pair of neighbours sharing a first letter scores 2, each
    further word continuing the run scores 1 more."""
    words = [w.lstrip(PUNCT + " ") for w in sentence.lower().split()]
    words = [w for w in words if w]
    score, in_run = 0, False
    for a, b in itertools.pairwise(words):
        if a[0] == b[0]:
            score += 1 if in_run else 2
            in_run = True
        else:
            in_run = False
    return score


def alliteration_increment(response: str) -> bool:
    """Each sentence has a longer alliterative run than the one before."""
    scores = [_alliteration(s) for s in sentences(response)]
    return all(b > a for a, b in zip([-1] + scores, scores))


def increment(response: str, small_n: float) -> bool:
    """Each sentence has exactly `small_n` more words than the previous one."""
    counts = [len(strip_punct(s).split()) for s in sentences(response)]
    return all(b == a + small_n for a, b in itertools.pairwise(counts))


def keyword(response: str, N: float, word: str) -> bool:
    """The N-th sentence contains `word` as a whole word (any case)."""
    sents = sentences(response)
    n = int(N)
    if len(sents) < n:
        return False
    return re.search(rf"\b{re.escape(word)}\b", sents[n - 1], re.IGNORECASE) is not None


CHECKERS = {
    "sentence:alliteration_increment": alliteration_increment,
    "sentence:increment": increment,
    "sentence:keyword": keyword,
}
