"""Text splitting for the IFBench checkers: sentences, words, tokens, stop words, syllables, emoji.

Called by the checker modules. The official checkers use NLTK (punkt, stopwords, a POS tagger)
and the `emoji`/`syllapy` packages; NLTK needs data downloads at run time, which our offline
machines cannot do, so these are small hand-written stand-ins. Counts can differ from NLTK's
on unusual text (abbreviations, odd punctuation); the module says where.
"""

from __future__ import annotations

import re
import string

PUNCT = string.punctuation
_NO_PUNCT = str.maketrans("", "", PUNCT)

# Abbreviations after which a period does not end a sentence (punkt learns these; we list them).
_ABBREV = frozenset(
    "mr mrs ms dr prof sr jr st vs etc e.g i.e fig no vol inc ltd co corp approx dept est "  # noqa: SIM905
    "jan feb mar apr jun jul aug sep sept oct nov dec u.s a.m p.m".split()
)
# A sentence ends at . ! ? (runs like "?!" or "..." included), plus closing quotes/brackets.
_END = re.compile(r"[.!?‽]+[\"'”’)\]]*(?=\s+|$)")

# NLTK's English stop-word list (the 179 words of `stopwords.words('english')`).
STOPWORDS = frozenset(
    """i me my myself we our ours ourselves you you're you've you'll you'd your yours yourself
    yourselves he him his himself she she's her hers herself it it's its itself they them their
    theirs themselves what which who whom this that that'll these those am is are was were be
    been being have has had having do does did doing a an the and but if or because as until
    while of at by for with about against between into through during before after above below
    to from up down in out on off over under again further then once here there when where why
    how all any both each few more most other some such no nor not only own same so than too
    very s t can will just don don't should should've now d ll m o re ve y ain aren aren't
    couldn couldn't didn didn't doesn doesn't hadn hadn't hasn hasn't haven haven't isn isn't ma
    mightn mightn't mustn mustn't needn needn't shan shan't shouldn shouldn't wasn wasn't weren
    weren't won won't wouldn wouldn't""".split()  # noqa: SIM905
)


def strip_punct(text: str) -> str:
    return text.translate(_NO_PUNCT)


def sentences(text: str) -> list[str]:
    """Split like punkt does in the common case: after . ! ? followed by whitespace.

    Not a boundary: a period after a listed abbreviation, a single capital initial ("J. Smith")
    or a digit followed by a digit ("3.5" never matches, as no space follows). Newlines alone
    do not end a sentence (punkt's behaviour too).
    """
    out, start = [], 0
    for m in _END.finditer(text):
        before = text[start : m.start()].split()
        last = before[-1].lower().rstrip(".") if before else ""
        lone_period = m.group(0).startswith(".") and len(m.group(0).rstrip("\"'”’)]")) == 1
        if lone_period and (last in _ABBREV or (len(last) == 1 and last.isalpha())):
            continue
        piece = text[start : m.end()].strip()
        if piece:
            out.append(piece)
        start = m.end()
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return out


def count_words(text: str) -> int:
    """Runs of word characters, as NLTK's RegexpTokenizer(r'\\w+') counts them."""
    return len(re.findall(r"\w+", text))


def count_stopwords(text: str) -> int:
    return sum(1 for w in re.findall(r"\w+", text) if w.lower() in STOPWORDS)


def tokens(text: str) -> list[str]:
    """Treebank-like tokens: words (with inner ' and -), numbers, and each punctuation mark."""
    return re.findall(r"\d+(?:[.,]\d+)+|\w+(?:['’-]\w+)*|[^\w\s]", text)


def word_tokens(text: str) -> list[str]:
    """`tokens` without the pure-punctuation ones."""
    return [t for t in tokens(text) if any(ch.isalnum() for ch in t)]


def syllables(word: str) -> int:
    """Vowel-group count with a silent final 'e'; a heuristic stand-in for `syllapy`."""
    w = re.sub(r"[^a-z]", "", word.lower())
    if not w:
        return 0
    count = len(re.findall(r"[aeiouy]+", w))
    if w.endswith("e") and not w.endswith(("le", "ee", "ye")) and count > 1:
        count -= 1
    return max(count, 1)


_EMOJI_RANGES = (
    (0x1F000, 0x1FAFF),  # mahjong .. symbols & pictographs extended-A (faces, objects, flags)
    (0x2600, 0x27BF),  # miscellaneous symbols, dingbats
    (0x2300, 0x23FF),  # technical (watch, hourglass, media keys)
    (0x2B00, 0x2BFF),  # arrows, stars (⭐ ⬆)
    (0x2190, 0x21FF),  # arrows (↔)
    (0x3030, 0x3030),
    (0x303D, 0x303D),
    (0x3297, 0x3299),
    (0x00A9, 0x00A9),
    (0x00AE, 0x00AE),
    (0x203C, 0x203C),
    (0x2049, 0x2049),
    (0x2122, 0x2122),
    (0x2139, 0x2139),
)


def is_emoji(ch: str) -> bool:
    """True for one emoji code point (ranges of the Unicode emoji set, not the full table)."""
    if len(ch) != 1:
        return False
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in _EMOJI_RANGES)
