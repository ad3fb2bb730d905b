"""IFBench `words:*` checkers: constraints on individual words (letters, lengths, positions).

Registered by `registry.py`; each takes the response and the row's kwargs, returns pass/fail.
`words:start_verb` is absent: it needs a part-of-speech tagger (NLTK data we cannot download).
"""

from __future__ import annotations

import itertools
import string
from collections import Counter

from experiments.scoring.ifbench.text import (
    PUNCT,
    sentences,
    strip_punct,
    syllables,
    tokens,
    word_tokens,
)

_CONSONANTS = frozenset("bcdfghjklmnpqrstvwxyz")


def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, int(n**0.5) + 1))


def _plain_words(response: str) -> list[str]:
    return strip_punct(response).lower().split()


def alphabet(response: str) -> bool:
    """Word i+1 starts with the letter after word i's, looping z -> a."""
    words = _plain_words(response)
    if not words or words[0][0] not in string.ascii_lowercase:
        return False
    letter = words[0][0]
    for word in words[1:]:
        letter = chr((ord(letter) - 97 + 1) % 26 + 97)
        if word[0] != letter:
            return False
    return True


def consonants(response: str) -> bool:
    """Every whitespace word holds two consonants in a row."""
    for word in response.lower().split():
        if not any(a in _CONSONANTS and b in _CONSONANTS for a, b in itertools.pairwise(word)):
            return False
    return True


def keywords_specific_position(response: str, keyword: str, n: float, m: float) -> bool:
    """The m-th word of the n-th sentence is `keyword`."""
    sents = sentences(response)
    if len(sents) < n:
        return False
    words = word_tokens(sents[int(n) - 1])
    return len(words) >= m and words[int(m) - 1].lower() == keyword.lower()


def last_first(response: str) -> bool:
    """Each sentence starts with the word that ended the one before."""
    sents = sentences(response)
    for prev, nxt in itertools.pairwise(sents):
        last = prev.rstrip(PUNCT + " ").split()
        first = nxt.lstrip(PUNCT + " ").split()
        if not last or not first or last[-1].lower() != first[0].lower():
            return False
    return True


def no_consecutive(response: str) -> bool:
    """No two neighbouring words share a first letter."""
    words = _plain_words(response)
    return all(a[0] != b[0] for a, b in itertools.pairwise(words))


def odd_even_syllables(response: str) -> bool:
    """Words alternate odd/even syllable counts (heuristic counter, see `text.syllables`)."""
    parity = [syllables(w) % 2 for w in _plain_words(response)]
    return all(a != b for a, b in itertools.pairwise(parity))


def palindrome(response: str) -> bool:
    """At least 10 palindromic words of 5+ letters (repeats count)."""
    return sum(1 for w in _plain_words(response) if len(w) >= 5 and w == w[::-1]) >= 10


def paragraph_last_first(response: str) -> bool:
    """Every line (paragraph) ends with the word it starts with."""
    for line in response.split("\n"):
        words = line.strip().lower().strip(PUNCT + " ").split()
        if words and words[0] != words[-1]:
            return False
    return True


def prime_lengths(response: str) -> bool:
    """Every word (punctuation removed) has a prime number of characters."""
    return all(_is_prime(len(w)) for w in strip_punct(response).split())


def repeats(response: str, small_n: float) -> bool:
    """No word occurs more than `small_n` times."""
    counts = Counter(_plain_words(response))
    return all(c <= small_n for c in counts.values())


def vowel(response: str) -> bool:
    """One paragraph using at most three distinct vowels."""
    lines = response.strip().split("\n")
    return len(lines) == 1 and len(set(lines[0].lower()) & set("aeiou")) <= 3


def words_position(response: str, keyword: str) -> bool:
    """`keyword` is both the second word and the second-to-last word."""
    toks = tokens(response)
    if toks and toks[-1] in PUNCT:
        toks = toks[:-1]
    if len(toks) < 2:
        return False
    return toks[1].lower() == toks[-2].lower() == keyword.lower()


CHECKERS = {
    "words:alphabet": alphabet,
    "words:consonants": consonants,
    "words:keywords_specific_position": keywords_specific_position,
    "words:last_first": last_first,
    "words:no_consecutive": no_consecutive,
    "words:odd_even_syllables": odd_even_syllables,
    "words:palindrome": palindrome,
    "words:paragraph_last_first": paragraph_last_first,
    "words:prime_lengths": prime_lengths,
    "words:repeats": repeats,
    "words:vowel": vowel,
    "words:words_position": words_position,
}
