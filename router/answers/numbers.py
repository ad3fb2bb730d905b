"""Number answers (GSM8K, numeric BBH tasks, generic files): find the final number, normalize it.

Called by the GSM8K, BBH and generic scorers; `canonical_number` makes "1,234" equal "1234.0".
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from router.answers.latex import last_boxed

# A signed number with optional thousands commas and decimals: -1,234.50, 3, .5
NUMBER_RE = re.compile(r"(?<![\w.])[-−]?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?![\d])")
_MARKERS = (
    re.compile(r"####\s*(.+)"),
    re.compile(r"answer\s*(?:is|:)\s*[:\s]*(.+)", re.IGNORECASE),
)


def canonical_number(text: str) -> str | None:
    """'$1,234.00' -> '1234', '-0.50' -> '-0.5', '3/4' -> '0.75'; None if not a number."""
    s = text.strip().replace("−", "-").replace("$", "").replace(",", "").replace(" ", "")
    s = s.rstrip(".")
    if re.fullmatch(r"-?\d+/\d+", s):
        num, den = s.split("/")
        if int(den) == 0:
            return None
        value = Decimal(num) / Decimal(den)
    else:
        try:
            value = Decimal(s)
        except InvalidOperation:
            return None
    if not value.is_finite():
        return None
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def numbers_in(text: str) -> list[str]:
    """Every number in reading order, as written (commas kept, '$' and spaces dropped)."""
    found = []
    for m in NUMBER_RE.finditer(text):
        raw = m.group(0).replace("$", "").replace(" ", "")
        if re.search(r"\d", raw):
            found.append(raw)
    return found


def last_number(text: str) -> str | None:
    """Canonical form of the last number in `text`, or None."""
    for raw in reversed(numbers_in(text)):
        value = canonical_number(raw)
        if value is not None:
            return value
    return None


def final_number(text: str) -> str | None:
    """The number after the last answer marker, else in the last \\boxed{}, else the last one.

    Markers are 'The answer is', 'Answer:' and '####'. Models often restate intermediate
    results after their final line and put units or a sentence after the marker, so the
    marker is searched from the end and the first number after it is taken.
    """
    value = marked_number(text)
    if value is None:
        boxed = last_boxed(text)
        value = last_number(boxed) if boxed else None
    return value if value is not None else last_number(text)


def marked_number(text: str) -> str | None:
    """The first number after the last answer marker that has one; None without a marker."""
    for marker in _MARKERS:
        hits = list(marker.finditer(text))
        for hit in reversed(hits):
            nums = numbers_in(hit.group(1))
            if nums:
                value = canonical_number(nums[0])
                if value is not None:
                    return value
    return None
