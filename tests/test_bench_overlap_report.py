"""benchmarks/bench_overlap.py's report: with `--num-samples 0` (concurrency 4 alone) it reports
the blocks it ran instead of crashing on the concurrency-1 file it never wrote."""

from __future__ import annotations

from synthetic_results import make_rows

from benchmarks.bench_overlap import report
from experiments.results import ResultRow

META = {"config": "tree", "dataset": "gsm8k", "first": "q0", "last": "q3", "device": "cpu"}
META |= {"c4": 4, "block": 4, "command": "python -m benchmarks.bench_overlap"}
META |= {"load_before": 0.5, "load_after": 0.6}


def test_concurrency_4_alone_is_reported_without_concurrency_1():
    rows = [
        ResultRow.model_validate(r) for r in make_rows(datasets=("gsm8k",), settings=(2, 3), n=4)
    ]
    blocks = [
        {"setting": 2, "questions": 4, "wall_s": 10.0},
        {"setting": 3, "questions": 4, "wall_s": 8.0},
    ]
    text = report([], rows, blocks, META)
    assert "concurrency 1" not in text
    assert "| throughput #3 ÷ #2 | **1.250** |" in text
    both = report(rows, rows, blocks, META)
    assert "| concurrency 1 (paired per question, #3 ÷ #2) |" in both
