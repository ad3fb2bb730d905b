"""IFBench `custom:*` checkers: one-off tasks with a known answer (CSV tables, sorted lists...).

Registered by `registry.py`; each takes the response (these ids have no kwargs), returns pass/fail.
"""

from __future__ import annotations

import csv
import io
import itertools
import re
import unicodedata

from experiments.scoring.ifbench.text import PUNCT, sentences

# Capitals of European countries north of 45°N, by latitude from north to south.
_CAPITALS = (  # noqa: SIM905 (a word list reads better as one string)
    "Reykjavik Helsinki Oslo Tallinn Stockholm Riga Moscow Copenhagen Vilnius Minsk Dublin "
    "Berlin Amsterdam Warsaw London Brussels Prague Luxembourg Paris Vienna Bratislava "
    "Budapest Vaduz Chisinau Bern Ljubljana Zagreb"
).split()


def _ascii(text: str) -> str:
    """'São Tomé' -> 'Sao Tome'."""
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")


def _rows(text: str, delimiter: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text.strip()), delimiter=delimiter))


def _header_ok(text: str, names: list[str], delimiter: str) -> bool:
    cells = [c.strip() for c in text.strip().split("\n")[0].split(delimiter)]
    return [c[1:-1] if len(c) > 1 and c[0] == c[-1] == '"' else c for c in cells] == names


def character_reverse(response: str) -> bool:
    """'bald eagle' written backwards letter by letter."""
    return "elgae dlab" in response.lower()


def word_reverse(response: str) -> bool:
    """A sentence about the bald eagle written with its words in reverse order."""
    words = response.lower().translate(str.maketrans("", "", PUNCT)).split()
    return "bald eagle" in " ".join(reversed(words))


def csv_city(response: str) -> bool:
    """Comma CSV: header ID,Country,City,Year,Count and 7 data rows of 5 fields."""
    rows = _rows(response, ",")
    return (
        len(rows) == 8
        and rows[0] == ["ID", "Country", "City", "Year", "Count"]
        and all(len(r) == 5 for r in rows[1:])
    )


def csv_quotes(response: str) -> bool:
    """Tab-separated: StudentID..Score header plus 3 rows, every field in double quotes."""
    names = ["StudentID", "Subject", "Grade", "Semester", "Score"]
    if not _header_ok(response, names, "\t"):
        return False
    lines = response.strip().split("\n")
    cells = [line.split("\t") for line in lines]
    return (
        len(lines) == 4
        and all(len(c) == 5 for c in cells)
        and all(f.strip()[:1] == '"' and f.strip()[-1:] == '"' for c in cells for f in c)
    )


def csv_special_character(response: str) -> bool:
    """Comma CSV: ProductID..Stock header plus 14 rows; some quoted field has a special char."""
    names = ["ProductID", "Category", "Brand", "Price", "Stock"]
    if not _header_ok(response, names, ","):
        return False
    rows = _rows(response, ",")
    if len(rows) != 15 or any(len(r) != 5 for r in rows):
        return False
    return re.search(r'"[^"\n]*[^\w\s"][^"\n]*"', response) is not None


def date_format_list(response: str) -> bool:
    """Comma-separated YYYY-MM-DD dates, all valid and within Napoleon's lifetime."""
    days = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30, 12: 31}
    for item in response.strip().split(","):
        m = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})", item.strip())
        if not m:
            return False
        year, month, day = (int(g) for g in m.groups())
        if not 1769 <= year <= 1821 or month not in days or day > days[month]:
            return False
    return True


def european_capitals_sort(response: str) -> bool:
    names = [c.strip() for c in _ascii(response).split(",") if c.strip()]
    return names == _CAPITALS


def mcq_count_length(response: str) -> bool:
    """Four questions, starting at once with 'Question', 5 options each, each one longer."""
    if not response.startswith("Question"):
        return False
    parts = re.split(r"\n*(?:Question \d+[.|):;]?\s*)", response)
    parts = [p.strip() for p in parts if p.strip()]
    if len(parts) != 4:
        return False
    lengths = []
    for part in parts:
        lines = [ln.strip() for ln in part.split("\n")]
        opt = [i for i, ln in enumerate(lines) if re.match(r"^[A-Ea-e][.)]\s*\w+", ln)]
        if len(opt) != 5:
            return False
        lengths.append(len(" ".join(lines[: opt[0]]).strip()))
    return all(a < b for a, b in itertools.pairwise(lengths))


def multiples(response: str) -> bool:
    """Exactly the multiples of 7 between 10 and 50, in order."""
    return re.findall(r"\d+", response) == [str(i) for i in range(14, 51, 7)]


def reverse_newline(response: str) -> bool:
    """African countries one per line in reverse alphabetical order, from Zimbabwe on."""
    lines = [ln.strip(PUNCT + " ") for ln in response.split("\n")]
    lines = [ln for ln in lines if ln]
    start = next((i for i, ln in enumerate(lines) if "Zimbabwe" in ln), None)
    if start is None or len(lines) - start < 52:
        return False
    names = [_ascii(ln) for ln in lines[start:]]
    return names == sorted(names, reverse=True)


def sentence_alphabet(response: str) -> bool:
    """26 sentences whose first words start with a, b, c, ... z."""
    sents = sentences(response)
    if len(sents) != 26:
        return False
    firsts = [s.split()[0].lower()[:1] if s.split() else "" for s in sents]
    return firsts == [chr(97 + i) for i in range(26)]


CHECKERS = {
    "custom:character_reverse": character_reverse,
    "custom:csv_city": csv_city,
    "custom:csv_quotes": csv_quotes,
    "custom:csv_special_character": csv_special_character,
    "custom:date_format_list": date_format_list,
    "custom:european_capitals_sort": european_capitals_sort,
    "custom:mcq_count_length": mcq_count_length,
    "custom:multiples": multiples,
    "custom:reverse_newline": reverse_newline,
    "custom:sentence_alphabet": sentence_alphabet,
    "custom:word_reverse": word_reverse,
}
