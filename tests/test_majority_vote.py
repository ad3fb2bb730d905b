"""DMV tallies and the aggregator-bypass choice."""

from __future__ import annotations

import pytest

from router.majority_vote import bypass_choice, consensus_agent, normalize_answer, vote


@pytest.mark.parametrize(
    "raw,norm",
    [
        ("18", "18"),
        (" 18. ", "18"),
        ("18.0", "18"),
        ("1,000", "1000"),
        ("0.5", "0.5"),
        ("B", "b"),
        ("x  +  1", "x + 1"),
        ("", None),
        ("  ", None),
        (None, None),
        ("nan", "nan"),
    ],
)
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


@pytest.mark.parametrize(
    "answers,planned,majority,count",
    [
        (["18", "18"], 3, True, 2),  # 2 of 3: no third vote can change it
        (["18", "17"], 3, False, 1),
        (["18", "18"], 4, False, 2),  # 2 of 4 is a tie, not a strict majority
        (["18", "18", "18"], 4, True, 3),
        (["18"], 1, True, 1),
        (["18"], 3, False, 1),
        ([None, None], 3, False, 0),  # no extracted answer never agrees
        (["5", "5", "7", "7", "5"], 9, False, 3),
        (["5"] * 5, 9, True, 5),
    ],
)
def test_vote_majority(answers, planned, majority, count):
    tally = vote(answers, planned)
    assert tally.majority is majority
    assert tally.count == count


def test_vote_ties_go_to_first_and_bad_planned():
    assert vote(["7", "5", "5", "7"], 4).answer == "7"
    with pytest.raises(ValueError, match="planned"):
        vote(["1", "2"], 1)


def test_consensus_agent_picks_most_confident_agreeing():
    ids = ["a", "b", "c"]
    assert consensus_agent(ids, ["18", "17", "18"], [0.5, 0.99, 0.7]) == "c"
    assert consensus_agent(ids, [None, None, None], [0.5, 0.99, 0.7]) == "b"
    assert consensus_agent([], [], []) is None
    with pytest.raises(ValueError, match="one entry per agent"):
        consensus_agent(ids, ["1"], [0.5])


def test_bypass_by_answer():
    ids = ["a", "b", "c"]
    assert bypass_choice(ids, ["4", "4.0", "4"], [0.5, 0.8, 0.6], "answer") == "b"
    assert bypass_choice(ids, ["4", "5", "4"], [0.5, 0.8, 0.6], "answer") is None
    assert bypass_choice(["a"], ["4"], [0.9], "answer") is None  # one output agrees with nothing
    assert bypass_choice(ids[:2], [None, None], [0.9, 0.9], "answer") is None


def test_bypass_by_q():
    ids = ["a", "b"]
    assert bypass_choice(ids, ["1", "2"], [0.4, 0.6], "q", q=0.95, q_threshold=0.9) == "b"
    assert bypass_choice(ids, ["1", "2"], [0.4, 0.6], "q", q=0.85, q_threshold=0.9) is None
    assert bypass_choice(ids, ["1", "2"], [0.4, 0.6], "q", q=None) is None
    with pytest.raises(ValueError, match="criterion"):
        bypass_choice(ids, ["1", "2"], [0.4, 0.6], "vibes")
