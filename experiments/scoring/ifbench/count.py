"""IFBench `count:*` checkers: how many words, numbers, names, pronouns, conjunctions... appear.

Registered by `registry.py`; each takes the response and the row's kwargs, returns pass/fail.
"""

from __future__ import annotations

import re

from experiments.scoring.ifbench.text import PUNCT, count_words, strip_punct, tokens

_CONJUNCTIONS = frozenset({"and", "but", "for", "nor", "or", "so", "yet"})
# The fixed name list the benchmark's prompts print ("use at least N of these names").
_PERSON_NAMES = (  # noqa: SIM905 (a word list reads better as one string)
    "Emma Liam Sophia Jackson Olivia Noah Ava Lucas Isabella Mason Mia Ethan Charlotte Alexander "
    "Amelia Benjamin Harper Leo Zoe Daniel Chloe Samuel Lily Matthew Grace Owen Abigail Gabriel "
    "Ella Jacob Scarlett Nathan Victoria Elijah Layla Nicholas Audrey David Hannah Christopher "
    "Penelope Thomas Nora Andrew Aria Joseph Claire Ryan Stella Jonathan"
).split()
_PRONOUNS = frozenset(
    """i me we us you he him she her it they them my mine our ours your yours his hers its their
    theirs myself ourselves yourself yourselves himself herself itself themselves this that
    these those who whom whose which what whoever whomever whatever whichever anybody anyone
    anything everybody everyone everything nobody nothing somebody someone something each
    either neither both all some any none""".split()  # noqa: SIM905
)
_KEYWORD_COUNTS = (1, 2, 3, 5, 7)  # keyword1 once, keyword2 twice, ... keyword5 seven times


def conjunctions(response: str, small_n: float) -> bool:
    """At least `small_n` different coordinating conjunctions."""
    found = {w.strip(PUNCT).lower() for w in response.split()} & _CONJUNCTIONS
    return len(found) >= small_n


def keywords_multiple(response: str, **kwargs: str) -> bool:
    """keyword1..keyword5 occur exactly 1, 2, 3, 5 and 7 times (substring count, any case)."""
    text = response.lower()
    keys = [kwargs[f"keyword{i}"] for i in range(1, 6)]
    return all(text.count(k.lower()) == n for k, n in zip(keys, _KEYWORD_COUNTS))


def numbers(response: str, N: float) -> bool:
    """Exactly N numbers; punctuation is removed first, so '3.5' and '1,000' count once."""
    return len(re.findall(r"\d+", strip_punct(response))) == N


def person_names(response: str, N: float) -> bool:
    """At least N different names from the benchmark's list, matched as whole words."""
    hits = {n for n in _PERSON_NAMES if re.search(rf"\b{re.escape(n)}\b", response)}
    return len(hits) >= N


def pronouns(response: str, N: float) -> bool:
    """At least N pronoun tokens ('she/her' counts twice)."""
    words = tokens(response.replace("/", " ").lower())
    return sum(1 for w in words if w in _PRONOUNS) >= N


def punctuation(response: str) -> bool:
    """Uses . , ! ? ; : and an interrobang ('?!', '!?' or '‽'), which may not double as ! or ?."""
    if not any(mark in response for mark in ("?!", "!?", "‽")):
        return False
    rest = response.replace("?!", "", 1) if "?!" in response else response.replace("!?", "", 1)
    return set(".,!?;:") <= set(rest)


def unique_word_count(response: str, N: float) -> bool:
    """At least N distinct lower-cased words (punctuation stripped from their ends)."""
    return len({w.strip(PUNCT + " ") for w in response.lower().split()}) >= N


def word_count_range(response: str, min_words: float, max_words: float) -> bool:
    return min_words <= count_words(response) <= max_words


def _is_japanese(word: str) -> bool:
    return re.search(r"[\u3040-\u30ff\u4e00-\u9fff]", word) is not None


def words_japanese(response: str, N: float) -> bool:
    """Every N-th whitespace word is Japanese (numbers exempt)."""
    n = int(N)
    for i, raw in enumerate(response.split(), start=1):
        word = raw.strip(PUNCT + " ")
        if i % n == 0 and word and not word.isdigit() and not _is_japanese(word):
            return False
    return True


CHECKERS = {
    "count:conjunctions": conjunctions,
    "count:keywords_multiple": keywords_multiple,
    "count:numbers": numbers,
    "count:person_names": person_names,
    "count:pronouns": pronouns,
    "count:punctuation": punctuation,
    "count:unique_word_count": unique_word_count,
    "count:word_count_range": word_count_range,
    "count:words_japanese": words_japanese,
}
