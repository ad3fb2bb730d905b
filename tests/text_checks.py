"""Looking for a phrase in what a command printed."""

from __future__ import annotations


def said(text: str) -> str:
    """The text with each run of whitespace as one space: a phrase is found however a stream
    wrapped it (rich wraps at the terminal's width, or 80 columns where there is none)."""
    return " ".join(text.split())
