"""Competition-math answers (MATH-500, AIME 2025, HMMT): extraction and grading with math-verify.

Called by `experiments.scoring` for the math datasets; `canonical` is also used for voting.
"""

from __future__ import annotations

import threading
from typing import Any

import sympy
from math_verify import parse, verify

from router.answers.latex import last_boxed

# math-verify enforces its timeout with SIGALRM, which only the main thread may install.
_TIMEOUT_S = 5


def _timeout() -> int | None:
    return _TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def parse_gold(answer: str) -> list[Any]:
    """Parse a gold LaTeX answer; `$...$` first, `\\boxed{}` when that finds nothing."""
    for wrapped in (f"${answer}$", f"\\boxed{{{answer}}}"):
        parsed = parse(wrapped, parsing_timeout=_timeout())
        if parsed:
            return parsed
    return []


def parse_output(text: str) -> list[Any]:
    """Parse a model output: the last boxed answer wins; otherwise math-verify's own search."""
    boxed = last_boxed(text)
    if boxed is not None:
        parsed = parse(f"\\boxed{{{boxed}}}", parsing_timeout=_timeout())
        if parsed:
            return parsed
    return parse(text, parsing_timeout=_timeout())


def canonical(parsed: list[Any]) -> str | None:
    """One string per mathematical value, so equal answers vote together (0.75 and 3/4 -> 3/4)."""
    if not parsed:
        return None
    expr = parsed[0]
    if isinstance(expr, sympy.Float):
        # Decimals written by a model are exact: "0.75" means 3/4, not a binary float.
        expr = sympy.Rational(str(parsed[1]) if len(parsed) > 1 else str(expr))
        expr = sympy.nsimplify(expr)
    if isinstance(expr, sympy.Basic):
        try:
            return str(sympy.simplify(expr)) if expr.is_number else str(expr)
        # simplify can fail on exotic expressions; the raw form still votes
        except (TypeError, ValueError, AttributeError, NotImplementedError, RecursionError):
            return str(expr)
    return str(parsed[-1])


def extract(text: str) -> str | None:
    return canonical(parse_output(text))


def grade(gold: str, text: str) -> tuple[bool, str | None]:
    """(correct, canonical extracted answer) for one model output against a gold answer."""
    pred = parse_output(text)
    gold_parsed = parse_gold(gold)
    if not pred or not gold_parsed:
        return False, canonical(pred)
    ok = verify(gold_parsed, pred, timeout_seconds=_timeout())
    return bool(ok), canonical(pred)
