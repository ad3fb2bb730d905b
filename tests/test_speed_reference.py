"""experiments/speed_reference.py: a pair's final agent, same tokens and alone, timed in both runs
gives the machine's drift between them; pairs with other tokens or failed runs give none; and
bench_overlap's report shows the drift and the end-to-end ratio over the steady pairs."""

from __future__ import annotations

from synthetic_results import make_rows

from benchmarks.bench_overlap import report
from experiments.critical_path import final_agent
from experiments.results import ResultRow
from experiments.speed_reference import final_decode_s, speed_ratios, steady

META = {"config": "tree", "dataset": "gsm8k", "first": "q0", "last": "q3", "device": "cpu"}
META |= {"c4": 4, "block": 4, "command": "python -m benchmarks.bench_overlap"}
META |= {"load_before": 0.5, "load_after": 0.6}


def pairs(n: int = 4) -> list[ResultRow]:
    """n questions run in #2 and #3, the final agent decoding 0.1 → 1.0 s in every run."""
    rows = make_rows(datasets=("gsm8k",), settings=(2, 3), n=n)
    return [ResultRow.model_validate(r) for r in rows]


def final_of(row: ResultRow):
    return row.agents[final_agent(row)]


def test_same_work_at_the_same_speed_is_one():
    rows = pairs()
    assert final_decode_s(rows[0]) == 1.0 - final_of(rows[0]).first_token_s
    ratios = speed_ratios(rows, 3, 2)
    assert sorted(ratios) == [f"gsm8k-{i}" for i in range(4)]
    assert all(abs(x - 1.0) < 1e-9 for x in ratios.values())
    assert steady(ratios) == set(ratios)


def test_a_slower_machine_in_one_run_is_its_ratio_and_leaves_the_steady_set():
    rows = pairs()
    slow = next(r for r in rows if r.sample_id == "gsm8k-1" and r.setting == 3)
    final = final_of(slow)
    final.end_s = final.first_token_s + 2 * (1.0 - final.first_token_s)
    ratios = speed_ratios(rows, 3, 2)
    assert abs(ratios["gsm8k-1"] - 2.0) < 1e-9
    assert abs(speed_ratios(rows, 2, 3)["gsm8k-1"] - 0.5) < 1e-9
    assert steady(ratios) == {"gsm8k-0", "gsm8k-2", "gsm8k-3"}
    assert steady(ratios, band=1.0) == set(ratios)


def test_no_ratio_for_other_tokens_or_a_failed_run():
    rows = pairs()
    other = next(r for r in rows if r.sample_id == "gsm8k-0" and r.setting == 3)
    final_of(other).output_ids = [7, 7]
    failed = next(r for r in rows if r.sample_id == "gsm8k-2" and r.setting == 2)
    failed.error = "router: 500"
    assert final_decode_s(failed) is None
    assert sorted(speed_ratios(rows, 3, 2)) == ["gsm8k-1", "gsm8k-3"]


def test_report_shows_the_drift_and_the_ratio_over_steady_pairs():
    rows = pairs()
    slow = next(r for r in rows if r.sample_id == "gsm8k-1" and r.setting == 3)
    final = final_of(slow)
    final.end_s = final.first_token_s + 2 * (1.0 - final.first_token_s)
    text = report(rows, [], [], META)
    assert "(the machine's own drift) | **1.000** [" in text
    assert "range 1.00–2.00 |" in text
    assert "| end-to-end latency on the pairs it moved ≤ 10% (3 of 4) | **" in text
