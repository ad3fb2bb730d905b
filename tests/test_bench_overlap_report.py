"""benchmarks/bench_overlap.py's report: with `--num-samples 0` (concurrency 4 alone) it reports
the blocks it ran instead of crashing on the concurrency-1 file it never wrote; and a run stopped
midway is reported from the folder it left (`--report-only`)."""

from __future__ import annotations

import json
import sys

import pytest
from synthetic_results import make_rows

from benchmarks.bench_overlap import main, report
from experiments.results import ResultRow

META = {"config": "tree", "dataset": "gsm8k", "first": "q0", "last": "q3", "device": "cpu"}
META |= {"c4": 4, "block": 4, "command": "python -m benchmarks.bench_overlap"}
META |= {"load_before": 0.5, "load_after": 0.6}


def test_concurrency_4_alone_is_reported_without_concurrency_1():
    rows = [
        ResultRow.model_validate(r) for r in make_rows(datasets=("gsm8k",), settings=(2, 3), n=4)
    ]
    blocks = [
        {"block": 0, "setting": 2, "questions": 4, "wall_s": 10.0},
        {"block": 0, "setting": 3, "questions": 4, "wall_s": 8.0},
    ]
    text = report([], rows, blocks, META)
    assert "concurrency 1" not in text
    assert "| throughput #3 ÷ #2 | **1.250** |" in text
    both = report(rows, rows, blocks, META)
    assert "| concurrency 1 (paired per question, #3 ÷ #2) |" in both


def test_a_stopped_run_is_reported_from_what_it_left(tmp_path, monkeypatch, capsys):
    """`--report-only` rebuilds the report from the folder: the rows, the blocks that ran in both
    settings (a stopped run's last block may have run in one) and the metadata from the start."""
    rows = make_rows(datasets=("gsm8k",), settings=(2, 3), n=4)
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    blocks = [
        {"block": 0, "setting": 2, "questions": 4, "wall_s": 10.0},
        {"block": 0, "setting": 3, "questions": 4, "wall_s": 8.0},
        {"block": 1, "setting": 3, "questions": 4, "wall_s": 1.0},  # #2 never ran
    ]
    (tmp_path / "c4_blocks.json").write_text(json.dumps(blocks))
    started = {k: v for k, v in META.items() if k != "load_after"}
    (tmp_path / "bench_meta.json").write_text(json.dumps(started))
    argv = ["bench_overlap", "--report-only", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    main()
    text = (tmp_path / "bench_overlap.md").read_text()
    assert text == capsys.readouterr().out.rstrip("\n") + "\n"
    assert "after not recorded (the run stopped before its end)" in text
    assert "| end-to-end latency (4 questions) |" in text
    assert "| throughput #3 ÷ #2 | **1.250** |" in text


def test_report_only_on_a_folder_without_a_run_names_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench_overlap", "--report-only", "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2
    assert not (tmp_path / "bench_overlap.md").exists()
