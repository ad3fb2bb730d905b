"""bench_warmup_cost's report: each pipelined variant against blocking per question, over all
questions and over those that started last in their block."""

from __future__ import annotations

from benchmarks.bench_warmup_cost import report


def test_report_pairs_each_question_with_blocking_and_singles_out_the_late_starters():
    times = {  # question: (#2, #3-slots, #3-weighed) in-flight seconds; positions 0..3
        "a": (100.0, 80.0, 80.0),
        "b": (100.0, 90.0, 85.0),
        "c": (100.0, 120.0, 95.0),  # started last (position >= N = 2)
        "d": (100.0, 140.0, 100.0),  # started last
    }
    rows = [
        {
            "id": q,
            "position": pos,
            "variant": v,
            "block": 0,
            "concurrency": 2,
            "block_wall_s": 200.0,
            "in_flight_s": t,
            "warmups_per_q": 0.0 if v == "#2" else 10.0,
            "slowdown.cpu": 0.25,
            **({"slowdown_weighed.cpu": 0.125} if v == "#3-weighed" else {}),
        }
        for pos, (q, ts) in enumerate(times.items())
        for v, t in zip(("#2", "#3-slots", "#3-weighed"), ts)
    ]
    # A second block in which the weighed gate sent fewer warm-ups (no paired #2 rows).
    rows += [{**r, "block": 1, "warmups_per_q": 4.0} for r in rows if r["variant"] == "#3-weighed"]
    text = report(rows, {"command": "x", "load_before": "0", "load_after": "0"})
    assert "| 2 | #2 | 4 | 0.0200 | 100.0 / 100.0 / 100.0 | 0.0 | cpu 0.250 |" in text
    assert "| 10.0 / 4.0 | cpu 0.250 (cpu 0.125) |" in text  # warm-ups by block, the bound
    # Slots: 0.8, 0.9, 1.2, 1.4 (median 1.05); the two late starters 1.2 and 1.4 (median 1.3).
    assert "| 2 | #3-slots | all | 4 | 1.050 [" in text and "| 0.800 | 1.400 |" in text
    assert "| 2 | #3-slots | started last | 2 | 1.300 [" in text
    assert "| 2 | #3-weighed | started last | 2 | 0.975 [" in text
