"""results.jsonl I/O: append-and-fsync writer, torn-line handling, resume keys, schema errors."""

import json
import logging

import pytest
from synthetic_results import make_rows

from experiments.results import ResultsError, ResultsWriter, completed_keys, read_results


def test_writer_appends_one_line_per_row_and_reader_round_trips(tmp_path):
    path = tmp_path / "run" / "results.jsonl"
    rows = make_rows(datasets=("gsm8k",), n=3)
    writer = ResultsWriter(path)
    for row in rows:
        writer.append({**row, "final_text": "The answer is 42"})
    lines = path.read_text().splitlines()
    assert len(lines) == len(rows)
    back = read_results(path)
    assert [(r.sample_id, r.setting) for r in back] == [
        (r["sample_id"], r["setting"]) for r in rows
    ]
    assert back[0].model_extra["final_text"] == "The answer is 42"
    assert back[0].agents["p0"].model == "qwen-4b"


def test_torn_last_line_is_skipped_with_a_warning_and_repaired_on_append(tmp_path, caplog):
    path = tmp_path / "results.jsonl"
    rows = make_rows(datasets=("gsm8k",), settings=(2,), n=3)
    writer = ResultsWriter(path)
    for row in rows[:2]:
        writer.append(row)
    with open(path, "a") as f:
        f.write(json.dumps(rows[2])[:40])  # a crash mid-write
    with caplog.at_level(logging.WARNING):
        assert len(read_results(path)) == 2
    assert "torn last line" in caplog.text
    assert completed_keys(path) == {("gsm8k-0", 2), ("gsm8k-1", 2)}
    ResultsWriter(path).append(rows[2])  # reopening cuts the torn tail first
    assert [json.loads(line)["sample_id"] for line in path.read_text().splitlines()] == [
        "gsm8k-0",
        "gsm8k-1",
        "gsm8k-2",
    ]


def test_bad_line_in_the_middle_is_an_error_naming_the_line(tmp_path):
    path = tmp_path / "results.jsonl"
    good = json.dumps(make_rows(datasets=("gsm8k",), settings=(2,), n=1)[0])
    path.write_text(f"{good}\n{{not json\n{good}\n")
    with pytest.raises(ResultsError, match=r"results.jsonl:2: not valid JSON"):
        read_results(path)


def test_schema_error_names_the_field(tmp_path):
    path = tmp_path / "results.jsonl"
    row = make_rows(datasets=("gsm8k",), settings=(2,), n=1)[0]
    with pytest.raises(ResultsError, match="setting"):
        ResultsWriter(path).append({**row, "setting": 8})
    path.write_text(json.dumps({**row, "e2e_s": "slow"}) + "\n")
    with pytest.raises(ResultsError, match=r":1: e2e_s"):
        read_results(path)


def test_resume_retries_failed_rows_and_the_retry_wins(tmp_path):
    path = tmp_path / "results.jsonl"
    rows = make_rows(datasets=("gsm8k",), settings=(3,), n=3, errors=1)
    writer = ResultsWriter(path)
    for row in rows:
        writer.append(row)
    assert completed_keys(path) == {("gsm8k-1", 3), ("gsm8k-2", 3)}
    assert ("gsm8k-0", 3) in completed_keys(path, retry_errors=False)
    writer.append({**rows[0], "error": None, "correct": True, "answer": "42"})
    back = read_results(path)
    assert len(back) == 3 and back[-1].sample_id == "gsm8k-0" and back[-1].ok
    assert completed_keys(path) == {("gsm8k-0", 3), ("gsm8k-1", 3), ("gsm8k-2", 3)}


def test_missing_file(tmp_path):
    assert completed_keys(tmp_path / "results.jsonl") == set()
    with pytest.raises(ResultsError, match="no such results file"):
        read_results(tmp_path / "results.jsonl")


def test_killed_agent_without_prefill_numbers_is_a_valid_row(tmp_path):
    """An agent killed by early exit before its final request has no prompt/cached tokens."""
    from experiments.results import ResultsWriter, read_results

    row = {
        "sample_id": "q1",
        "dataset": "gsm8k",
        "setting": 4,
        "answer": "3",
        "gold": "3",
        "correct": True,
        "e2e_s": 1.0,
        "error": None,
        "early_exit": [],
        "agents": {
            "leaf": {
                "model": "m",
                "killed": True,
                "prompt_tokens": None,
                "cached_tokens": None,
                "output_ids": [1],
            }
        },
    }
    ResultsWriter(tmp_path / "results.jsonl").append(row)
    (back,) = read_results(tmp_path / "results.jsonl")
    assert back.agents["leaf"].killed and back.agents["leaf"].prompt_tokens is None
