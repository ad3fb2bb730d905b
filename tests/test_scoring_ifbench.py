"""IFBench checkers on real test rows with hand-written compliant and non-compliant responses."""

from __future__ import annotations

import pytest

from experiments.datasets import load_questions
from experiments.scoring import ifbench, ifbench_coverage, score
from experiments.scoring.ifbench.registry import checker_for, ids_in_test_set, missing


@pytest.fixture(scope="module")
def rows():
    qs = load_questions("ifbench")
    by_id = {}
    for q in qs:
        for inst in q.extra["instruction_id_list"]:
            by_id.setdefault(inst, []).append(q)
    return qs, by_id


def _single(by_id, inst_id):
    """The first row whose only instruction is `inst_id`."""
    return next(q for q in by_id[inst_id] if len(q.extra["instruction_id_list"]) == 1)


def test_coverage_is_reported_honestly() -> None:
    cov = ifbench_coverage()
    assert cov.total == 58 == len(ids_in_test_set())
    assert cov.implemented == 58 - len(missing())
    assert missing() == ["words:start_verb"]  # needs a POS tagger


def test_every_row_runs_and_uncovered_is_none(rows) -> None:
    qs, by_id = rows
    details = [score(q, q.question).details for q in qs]
    agg = ifbench.aggregate(details)
    assert agg["prompts"] == 300 and agg["instructions"] == 344
    assert agg["instructions_covered"] == 344 - 6  # words:start_verb appears 6 times
    verb = _single(by_id, "words:start_verb")
    got = score(verb, "Build an empire.")
    assert got.correct is None and got.details["followed"] == [None]


def test_keywords_multiple(rows) -> None:
    q = _single(rows[1], "count:keywords_multiple")
    kw = q.extra["kwargs"][0]
    good = " ".join(
        [kw["keyword1"]]
        + [kw["keyword2"]] * 2
        + [kw["keyword3"]] * 3
        + [kw["keyword4"]] * 5
        + [kw["keyword5"]] * 7
    )
    assert score(q, good).correct is True
    assert score(q, good + " " + kw["keyword1"]).correct is False
    assert score(q, "").correct is False  # strict mode: an empty response follows nothing


def test_word_count_range_and_numbers(rows) -> None:
    q = _single(rows[1], "count:word_count_range")
    lo = int(q.extra["kwargs"][0]["min_words"])
    assert score(q, " ".join(["word"] * lo)).correct is True
    assert score(q, " ".join(["word"] * (lo - 1))).correct is False
    q = _single(rows[1], "count:numbers")
    n = int(q.extra["kwargs"][0]["N"])
    assert score(q, "Values: " + ", ".join(str(i + 10) for i in range(n)) + ".").correct
    assert not score(q, "Values: " + ", ".join(str(i) for i in range(n + 1)) + ".").correct


def test_format_checkers(rows) -> None:
    by_id = rows[1]
    q = _single(by_id, "format:no_whitespace")
    assert score(q, "Yes,allsetsareclasses.").correct
    assert not score(q, "Yes, all sets are classes.").correct
    q = _single(by_id, "format:output_template")
    assert score(q, "My Answer: a\nMy Conclusion: b\nFuture Outlook: c").correct
    assert not score(q, "My Answer: a\nMy Conclusion: b").correct
    q = _single(by_id, "format:parentheses")
    assert score(q, "The lines (are [skew {since (no [common] point) exists}]).").correct
    assert not score(q, "The lines (are [skew {since}]).").correct
    q = _single(by_id, "format:options")
    assert score(q, "Maybe.").correct and not score(q, "Perhaps, maybe.").correct
    q = _single(by_id, "format:line_indent")
    assert score(q, "Timing\n  matters\n    in\n      frames").correct
    assert not score(q, "Timing\n  matters\n  in").correct
    q = _single(by_id, "format:emoji")
    assert score(q, "We are friends 🙂. We must not be enemies 🤝.").correct
    assert not score(q, "We are friends 🙂. We must not be enemies.").correct
    q = _single(by_id, "format:sub-bullets")
    assert score(q, "* Light\n  - less photosynthesis\n* Heat\n  - cooler air").correct
    assert not score(q, "* Light\n* Heat\n  - cooler air").correct
    q = _single(by_id, "format:thesis")
    assert score(q, "<i>Keys stay hidden.</i>\nThe decryption happens in hardware.").correct
    assert not score(q, "Keys stay hidden. The decryption happens in hardware.").correct


def test_sentence_and_word_checkers(rows) -> None:
    by_id = rows[1]
    q = _single(by_id, "sentence:increment")
    step = int(q.extra["kwargs"][0]["small_n"])
    one, two = "Harambe lived.", "Harambe lived " + " ".join(["long"] * step) + "."
    assert score(q, f"{one} {two}").correct
    assert not score(q, f"{one} {one}").correct
    q = _single(by_id, "words:last_first")
    assert score(q, "Models sample tokens. Tokens vary per run. Run again.").correct
    assert not score(q, "Models sample tokens. Outputs vary per run.").correct
    q = _single(by_id, "words:palindrome")
    pals = "level radar civic refer rotor kayak madam racecar stats tenet"
    assert score(q, f"Ozone words: {pals}.").correct
    assert not score(q, "Ozone words: level radar civic.").correct
    q = _single(by_id, "words:prime_lengths")
    assert score(q, "He is an odd man.").correct
    assert not score(q, "Baudrillard means simulation.").correct
    q = _single(by_id, "words:no_consecutive")
    assert score(q, "Klaus has dark eyes.").correct
    assert not score(q, "Klaus keeps dark eyes.").correct


def test_repeat_and_custom_checkers(rows) -> None:
    by_id = rows[1]
    q = _single(by_id, "repeat:repeat_change")
    req = q.extra["kwargs"][0]["prompt_to_repeat"]
    assert score(q, "Create " + " ".join(req.split()[1:])).correct
    assert not score(q, req).correct
    q = _single(by_id, "repeat:repeat_span")
    kw = q.extra["kwargs"][0]
    words = kw["prompt_to_repeat"].split()[kw["n_start"] : kw["n_end"] + 1]
    assert score(q, " ".join(words)).correct
    assert not score(q, kw["prompt_to_repeat"]).correct
    q = _single(by_id, "custom:multiples")
    assert score(q, "14, 21, 28, 35, 42, 49").correct
    assert not score(q, "7, 14, 21, 28, 35, 42, 49").correct
    q = _single(by_id, "custom:csv_city")
    rows_ = "\n".join(f"{i},France,Paris,2020,{i * 3}" for i in range(1, 8))
    assert score(q, "ID,Country,City,Year,Count\n" + rows_).correct
    assert not score(q, "ID,Country,City,Year\n" + rows_).correct
    assert checker_for("custom:character_reverse")("elgae dlaB ehT")


def test_two_instruction_row_needs_both(rows) -> None:
    qs, _ = rows
    q = next(
        q
        for q in qs
        if sorted(q.extra["instruction_id_list"]) == ["count:numbers", "count:unique_word_count"]
    )
    n = int(q.extra["kwargs"][q.extra["instruction_id_list"].index("count:numbers")]["N"])
    got = score(q, " ".join(["5"] * n))  # n numbers, but one unique word
    assert got.correct is False and got.details["followed"].count(True) == 1
