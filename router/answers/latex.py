"""LaTeX answer markers shared by the scorers: the last \\boxed{...} of a model output.

Called by the math, GSM8K and generic scorers.
"""

from __future__ import annotations


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), braces balanced; None if absent."""
    boxed, fbox = text.rfind("\\boxed"), text.rfind("\\fbox")
    if boxed < 0 and fbox < 0:
        return None
    name_end = boxed + len("\\boxed") if boxed > fbox else fbox + len("\\fbox")
    rest = text[name_end:].lstrip()
    if not rest.startswith("{"):
        # "\\boxed 5" form: the answer runs to the next whitespace or "$".
        words = rest.split()
        return words[0].rstrip("$.") if words else None
    open_at = len(text) - len(rest)
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
    return None
