"""Letter and exact-match scoring on real MMLU-ProX-Lite and BBH rows, and unknown datasets."""

from __future__ import annotations

import dataclasses

import pytest

from experiments.datasets import load_questions
from experiments.scoring import extract_answer, score


@pytest.fixture(scope="module")
def mmlu():
    return load_questions("mmlu_prox_lite", num_samples=50)


@pytest.fixture(scope="module")
def bbh():
    return load_questions("bbh")


@pytest.mark.parametrize(
    "text",
    [
        "The answer is (I).",
        "Answer: I",
        "After weighing all options... **I**",
        "Options C and F fail; the remaining one is (I)",
        "Let me think. A is wrong.\nAnswer: I think it is (I)",
        "The correct option is **I: Unsafe practices**.",
        "Final answer: $\\boxed{I}$",
    ],
)
def test_mmlu_letter_phrasings(mmlu, text: str) -> None:
    q = next(q for q in mmlu if q.id == "mmlu_prox_lite-en-70")
    assert q.answer == "I"
    got = score(q, text)
    assert got.correct and got.extracted == "I", text


def test_mmlu_wrong_and_mid_text(mmlu) -> None:
    q = mmlu[0]
    wrong = "ABCDEFGHIJ"[(q.extra["answer_index"] + 1) % len(q.extra["choices"])]
    assert not score(q, f"The answer is ({wrong}).").correct
    # A restated option list early on must not beat the final answer line.
    text = f"(A) is tempting, (B) too.\nSo the answer is ({q.answer}), clearly.\nDone."
    assert score(q, text).correct
    # "the answer is a ..." is the article, not option A.
    assert extract_answer("mmlu_prox_lite", "I think the answer is a tricky one") is None


def test_mmlu_option_text_without_letter(mmlu) -> None:
    q = mmlu[0]
    text = "After the analysis the right choice is\n" + q.extra["choices"][q.extra["answer_index"]]
    assert score(q, text).correct


def test_bbh_gold_targets_round_trip(bbh) -> None:
    for q in bbh[::7]:
        got = score(q, f"Let's think step by step. ... So the answer is {q.answer}.")
        assert got.correct, (q.id, q.answer, got.extracted)


def test_bbh_per_task_formats(bbh) -> None:
    by_task = {}
    for q in bbh:
        by_task.setdefault(q.extra["task"], q)
    be = by_task["boolean_expressions"]  # gold False
    assert score(be, "not True is False; False and True is False. So the answer is False.").correct
    assert not score(be, "So the answer is True.").correct
    assert score(be, "**false**").correct
    ff = by_task["formal_fallacies"]
    assert score(ff, f"the argument is deductively {ff.answer}.").correct
    other = "invalid" if ff.answer == "valid" else "valid"
    assert not score(ff, f"So the answer is {other}.").correct
    dyck = by_task["dyck_languages"]  # gold "] ]"
    assert score(dyck, "So the answer is ]].").correct
    ws = by_task["word_sorting"]
    assert score(ws, f"So the answer is: {', '.join(ws.answer.split())}").correct
    mc = next(q for q in bbh if q.extra["task"] == "date_understanding")
    assert score(mc, f"the answer is **{mc.answer}**").correct
    assert score(mc, f"So the answer is {mc.answer.strip('()')}.").correct
    oc = by_task["object_counting"]
    assert score(oc, f"I count them one by one: 1, 2. So the answer is {oc.answer}.").correct


def test_bbh_gold_given_as_option_text(bbh) -> None:
    q = next(q for q in bbh if q.id == "bbh-ruin_names-144")
    assert score(q, "So the answer is rita, sue and bob poo.").correct
    assert score(q, "So the answer is (D) sue and bob poo.").correct is False


def test_bbh_extract_without_task_is_consistent() -> None:
    assert extract_answer("bbh", "So the answer is (C).") == "(C)"
    assert extract_answer("bbh", "answer: c") == "(C)"


def test_generic_dataset_fallback(bbh) -> None:
    q = dataclasses.replace(bbh[0], dataset="my_file", answer="1,234", extra={})
    assert score(q, "So the answer is 1234.0").correct
    assert score(q, "\\boxed{1234}").correct
    assert not score(q, "The answer is 1235").correct
    q2 = dataclasses.replace(q, answer="Paris")
    assert score(q2, "The answer is: **paris**.").correct
