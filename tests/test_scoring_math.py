"""Number and math-verify scoring on real GSM8K, MATH-500, AIME 2025 and HMMT rows."""

from __future__ import annotations

import dataclasses

import pytest

from experiments.datasets import load_questions
from experiments.scoring import extract_answer, score


@pytest.fixture(scope="module")
def gsm8k():
    return load_questions("gsm8k", num_samples=200)


@pytest.fixture(scope="module")
def math500():
    return load_questions("math500")


def test_gsm8k_gold_solutions_score_correct(gsm8k) -> None:
    for q in gsm8k:
        assert score(q, q.extra["solution"]).correct, q.id


def test_gsm8k_comma_dollars_units_and_markers(gsm8k) -> None:
    q = next(q for q in gsm8k if q.answer == "18")
    assert score(q, "She makes 9 * 2 = $18 every day.\nThe answer is $18 dollars.").correct
    assert score(q, "Total: **18**").correct
    # The marker wins over numbers restated after it.
    got = score(q, "The answer is 18.\n(Check: 16 - 3 - 4 = 9 eggs, 9 * 2 = 18; 3 eggs eaten.)")
    assert got.correct and got.extracted == "18"
    assert not score(q, "The answer is 16.").correct
    assert score(q, "no number here").extracted is None


def test_gsm8k_canonical_answers_compare_equal() -> None:
    assert extract_answer("gsm8k", "The answer is 1,234.") == "1234"
    assert extract_answer("gsm8k", "so it is 1234.0") == "1234"
    assert extract_answer("gsm8k", "\\boxed{1,234}") == "1234"
    assert extract_answer("gsm8k", "It was -3 degrees; the answer is -3.") == "-3"
    assert extract_answer("gsm8k", "The answer is 0.50 dollars") == "0.5"


def test_math500_gold_solutions_score_correct(math500) -> None:
    for q in math500[:150]:
        assert score(q, q.extra["solution"]).correct, q.id


def test_fraction_equals_decimal(math500) -> None:
    q = next(q for q in math500 if q.id == "test/intermediate_algebra/986.json")
    assert q.answer == "\\frac{16}{5}"
    assert score(q, "Hence the maximum is $3.2$.").correct
    assert score(q, "Hence the maximum is \\boxed{3.2}").correct
    # The brief's case on the same real row, gold swapped to 3/4.
    three_quarters = dataclasses.replace(q, answer="\\frac{3}{4}")
    assert score(three_quarters, "so the answer is 0.75").correct
    assert score(dataclasses.replace(q, answer="0.75"), "\\boxed{\\frac{3}{4}}").correct
    assert extract_answer("math500", "so \\boxed{\\frac{3}{4}}") == "3/4"
    assert extract_answer("math500", "the answer is 0.75") == "3/4"
    assert extract_answer("aime2025", "\\boxed{1,234}") == extract_answer("aime2025", "1234.0")


def test_math500_wrong_and_mid_text_answers(math500) -> None:
    q = next(q for q in math500 if q.id == "test/precalculus/807.json")
    assert q.answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert score(q, "First $r=3$. So we get $\\boxed{(3, \\pi/2)}$ and we are done.").correct
    assert not score(q, "The point is \\boxed{(3, \\pi)}.").correct
    assert not score(q, "I cannot solve this.").correct


def test_aime_and_hmmt_rows() -> None:
    aime = load_questions("aime2025", num_samples=1)[0]
    assert aime.answer == "70"
    assert score(aime, "The bases are 21 and 49, so the sum is $\\boxed{70}$.").correct
    assert not score(aime, "\\boxed{71}").correct
    hmmt = {q.answer: q for q in load_questions("hmmt_feb_2025")}
    q = hmmt["\\frac{1}{576}"]
    assert score(q, "The probability is \\boxed{\\dfrac{1}{576}}").correct
    assert score(q, "The probability is \\boxed{1/576}").correct
    assert not score(q, "\\boxed{\\frac{1}{575}}").correct
