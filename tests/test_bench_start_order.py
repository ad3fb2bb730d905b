"""bench_start_order's report: each critical-path-first variant against its config-order one and
#3 against #2 in each order, per question, with the throughput ratios and median critical paths;
and the shared loop's variant order rotating per block."""

from __future__ import annotations

from benchmarks.bench_start_order import report
from benchmarks.variant_blocks import rotated


def _row(q: str, variant: str, t: float, block: int = 0) -> dict:
    parts = {"leaf_prefill": 1.0, "exposed_prefill": 2.0, "decode": t - 3.0, "other": 0.0}
    return {
        "id": q,
        "position": 0,
        "variant": variant,
        "block": block,
        "concurrency": 1,
        "block_wall_s": t,
        "in_flight_s": t,
        "warmups": 0 if variant.startswith("#2") else 10,
        "critical_path": parts,
    }


def test_report_pairs_each_variant_with_its_reference():
    times = {  # question: (#2-config, #3-config, #2-critical, #3-critical) seconds
        "a": (20.0, 18.0, 19.0, 17.0),
        "b": (30.0, 27.0, 27.0, 24.3),
    }
    names = ("#2-config", "#3-config", "#2-critical", "#3-critical")
    rows = [
        _row(q, v, t, block)
        for block, (q, ts) in enumerate(times.items())
        for v, t in zip(names, ts)
    ]
    text = report(rows, {"command": "x", "load_before": "0", "load_after": "0"})
    assert (
        "| 1 | #3-critical | 2 | 0.0484 | 20.6 / 20.6 / 23.6 | 10.0 | 1.00 / 2.00 / 17.65 / 0.00 | - |"
        in text
    )
    # #2: 19/20 = 0.95 and 27/30 = 0.90, median 0.925; throughput 50 s / 46 s.
    assert (
        "| 1 | #2-critical ÷ #2-config | all | 2 | 0.925 [" in text and "| 0.900 | 0.950 |" in text
    )
    assert "| 1 | #2-critical ÷ #2-config | 1.087 |" in text
    assert "| 1 | #3-critical ÷ #3-config | all | 2 |" in text
    assert "| 1 | #3-config ÷ #2-config | all | 2 | 0.900 [" in text
    assert "started last" not in text  # only at N > 1


def test_variants_take_turns_going_first():
    names = ["a", "b", "c"]
    assert [rotated(names, b) for b in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]
