"""Loader and prompt builders on the vendored splits: row counts, fields, and clear errors."""

from __future__ import annotations

import pytest

from experiments.datasets import DATASETS, USER_FILE_DATASETS, Question, load_questions
from experiments.prompts import build_question_prompt

ROWS = {
    "gsm8k": 1319,
    "math500": 500,
    "aime2025": 30,
    "hmmt_feb_2025": 30,
    "mmlu_prox_lite": 588,
    "ifbench": 300,
    "bbh": 6511,
    "mmlu": 5700,
    "humaneval": 164,
}
NO_GOLD = ("ifbench", "humaneval")  # graded by checkers or tests, not against an answer


@pytest.mark.parametrize("name", [n for n in DATASETS if n not in USER_FILE_DATASETS])
def test_every_split_loads_with_its_row_count(name: str) -> None:
    qs = load_questions(name)
    assert len(qs) == ROWS[name]
    assert len({q.id for q in qs}) == len(qs)
    assert all(q.dataset == name and q.question for q in qs)
    assert all((q.answer is None) == (name in NO_GOLD) for q in qs)


def test_num_samples_takes_the_first_rows() -> None:
    qs = load_questions("gsm8k", num_samples=3)
    assert [q.id for q in qs] == ["gsm8k-test-0000", "gsm8k-test-0001", "gsm8k-test-0002"]
    assert qs[0].answer == "18" and qs[0].extra["solution"].endswith("#### 18")


def test_a_seeded_shuffle_spans_subjects_and_offsets_give_disjoint_sets() -> None:
    train = load_questions("mmlu", num_samples=40, shuffle_seed=0)
    held = load_questions("mmlu", num_samples=40, shuffle_seed=0, offset=40)
    assert [q.id for q in train] == [q.id for q in load_questions("mmlu", 40, shuffle_seed=0)]
    assert not {q.id for q in train} & {q.id for q in held}
    # The file holds 100 questions per subject in a row: its first 40 are one subject.
    assert len({q.extra["subject"] for q in load_questions("mmlu", 40)}) == 1
    assert len({q.extra["subject"] for q in train}) > 20
    both = load_questions("mmlu", num_samples=80, shuffle_seed=0)
    assert [q.id for q in both] == [q.id for q in train + held]
    with pytest.raises(ValueError, match="offset"):
        load_questions("mmlu", 1, offset=-1)
    with pytest.raises(ValueError, match="offset 5700 skips all of its 5700 questions"):
        load_questions("mmlu", 1, offset=5700)


def test_a_mix_takes_one_question_of_each_dataset_in_turn_and_keeps_their_own() -> None:
    mix = load_questions("gsm8k,mmlu,humaneval", num_samples=9, shuffle_seed=3)
    assert [q.dataset for q in mix] == ["gsm8k", "mmlu", "humaneval"] * 3
    by_name = {n: load_questions(n, 3, shuffle_seed=3) for n in ("gsm8k", "mmlu", "humaneval")}
    assert [q for q in mix if q.dataset == "mmlu"] == by_name["mmlu"]  # each its seeded shuffle
    assert mix == load_questions("gsm8k,mmlu,humaneval", num_samples=9, shuffle_seed=3)
    held = load_questions("gsm8k,mmlu,humaneval", num_samples=9, shuffle_seed=3, offset=9)
    assert not {q.id for q in mix} & {q.id for q in held}
    # Past the smallest member's end the others go on alone: every question once.
    whole = load_questions("aime2025,humaneval")
    assert len(whole) == 30 + 164 and len({q.id for q in whole}) == len(whole)
    assert {q.dataset for q in whole[60:]} == {"humaneval"}
    for bad, what in (
        ("gsm8k,", "two or more different datasets"),
        ("gsm8k,gsm8k", "two or more different datasets"),
        ("gsm8k,nosuch", "unknown dataset 'nosuch'"),
    ):
        with pytest.raises(ValueError, match=what):
            load_questions(bad, 1)
    with pytest.raises(ValueError, match="offset 194 skips all of its 194 questions"):
        load_questions("aime2025,humaneval", 1, offset=194)


def test_a_mix_whose_members_share_ids_is_refused(tmp_path) -> None:
    """A run keys its rows, its resume and its blocks on question ids."""
    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"id": "gsm8k-test-0003", "question": "Two plus two?", "answer": "4"}\n')
    with pytest.raises(ValueError, match="gsm8k and .*mine.jsonl share question ids"):
        load_questions(f"gsm8k,{mine}", 2)


def test_extra_fields_survive_arrow() -> None:
    mmlu = load_questions("mmlu_prox_lite", num_samples=1)[0]
    assert mmlu.answer == "ABCDEFGHIJ"[mmlu.extra["answer_index"]]
    ifb = load_questions("ifbench", num_samples=1)[0]
    # Arrow unifies struct keys across rows; the loader must not invent null kwargs.
    assert ifb.extra["kwargs"] == [
        {
            "keyword1": "kaleidoscope",
            "keyword2": "nebula",
            "keyword3": "whisper",
            "keyword4": "labyrinth",
            "keyword5": "paradox",
        }
    ]
    assert load_questions("bbh", num_samples=1)[0].extra["task"] == "boolean_expressions"


def test_question_is_frozen_and_hashable() -> None:
    q = load_questions("aime2025", num_samples=1)[0]
    with pytest.raises(AttributeError):
        q.answer = "1"  # type: ignore[misc]
    assert {q: 1}[q] == 1


def test_any_jsonl_path_loads(tmp_path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text(
        '{"id": "a", "question": "1+1?", "answer": 2}\n\n{"id": "b", "question": "x"}\n'
    )
    qs = load_questions(str(path), cache_dir=tmp_path / "cache")
    assert qs == [Question("a", "1+1?", "2", "mine", {}), Question("b", "x", None, "mine", {})]


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown dataset 'gsm9k'.*gsm8k"):
        load_questions("gsm9k")


def test_missing_file_is_named(tmp_path) -> None:
    with pytest.raises(ValueError, match="nope.jsonl does not exist"):
        load_questions(str(tmp_path / "nope.jsonl"))


def test_row_without_question_names_file_and_line(tmp_path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "question": "q"}\n\n{"id": "b", "answer": "1"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl, line 3: row has no 'question'"):
        load_questions(str(path), cache_dir=tmp_path / "cache")


def test_row_without_id_and_bad_json(tmp_path) -> None:
    path = tmp_path / "noid.jsonl"
    path.write_text('{"question": "q"}\n')
    with pytest.raises(ValueError, match=r"noid.jsonl, line 1: row has no 'id'"):
        load_questions(str(path), cache_dir=tmp_path / "cache")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": "a", "question": "q"}\n{"id": oops}\n')
    with pytest.raises(ValueError, match=r"broken.jsonl, line 2: not valid JSON"):
        load_questions(str(broken), cache_dir=tmp_path / "cache")


def test_prompts_per_dataset() -> None:
    mmlu = load_questions("mmlu_prox_lite", num_samples=1)[0]
    prompt = build_question_prompt(mmlu)
    assert f"A. {mmlu.extra['choices'][0]}" in prompt and "I. " in prompt
    assert "letter" in prompt
    assert "\\boxed{}" in build_question_prompt(load_questions("math500", num_samples=1)[0])
    assert "The answer is N" in build_question_prompt(load_questions("gsm8k", num_samples=1)[0])
    ifb = load_questions("ifbench", num_samples=1)[0]
    assert build_question_prompt(ifb) == ifb.question
    bbh = load_questions("bbh", num_samples=1)[0]
    assert "True or False" in build_question_prompt(bbh)
