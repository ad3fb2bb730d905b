"""Per-setting statistics: accuracy with SE, latency percentiles, per-sample normalization to
#1 and #2, activation %, early-exit overhead, warm-ups, cached-token ratio, summary.json."""

import json
import math

import numpy as np
import pytest
from rich.console import Console
from synthetic_results import make_rows

from experiments.plot_cmd import rebuild
from experiments.results import ResultsWriter, validate_row
from experiments.summary import summarize
from experiments.summary_table import build_table


def _agent(model, precursors=(), killed=False, warmups=0, prompt=0, cached=0):
    return {
        "model": model,
        "output_ids": [1],
        "text": "x",
        "start_s": 0.0,
        "first_token_s": 0.1,
        "end_s": 1.0,
        "warmups": warmups,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "slot_order": list(precursors),
        "killed": killed,
    }


def _row(sid, setting, e2e, correct=True, agents=None, ee=(), error=None):
    return validate_row(
        {
            "sample_id": sid,
            "dataset": "toy",
            "setting": setting,
            "answer": "1",
            "gold": "1",
            "correct": correct,
            "e2e_s": e2e,
            "agents": agents or {},
            "early_exit": list(ee),
            "error": error,
        }
    )


def _by_setting(rows):
    return {s.setting: s for s in summarize(rows)}


def test_latency_normalization_reports_ratio_median_and_ratio_of_means():
    rows = [
        _row("a", 1, 10.0),
        _row("b", 1, 20.0),
        _row("c", 1, 40.0),
        _row("a", 2, 5.0, correct=False),
        _row("b", 2, 5.0, correct=None),
        _row("c", 2, 10.0),
        _row("d", 2, 99.0, error="worker died", correct=None),
    ]
    s = _by_setting(rows)
    two = s[2]
    assert (two.n, two.errors, two.graded) == (4, 1, 2)
    assert two.accuracy == 0.5 and two.accuracy_se == pytest.approx(math.sqrt(0.25 / 2))
    assert two.latency_mean_s == pytest.approx(20 / 3)  # the failed row is left out
    assert two.latency_median_s == 5.0 and two.latency_p90_s == pytest.approx(9.0)
    assert two.latency_vs_1_median == pytest.approx(0.25)  # ratios 0.5, 0.25, 0.25
    assert two.latency_vs_1_mean == pytest.approx(20 / 70)
    assert two.latency_vs_2_median == 1.0 and s[1].latency_vs_1_median == 1.0
    assert s[1].latency_vs_2_median == pytest.approx(4.0)  # 10/5, 20/5, 40/10


def test_activation_ee_overhead_warmups_and_cached_ratio():
    tree = {
        "p0": _agent("small"),
        "p1": _agent("small", killed=True),
        "p2": _agent("big"),
        "agg": _agent("big", ["p0", "p2"], warmups=3, prompt=200, cached=150),
    }
    ee = [
        {
            "cluster": "agg",
            "completed": ["p0", "p2"],
            "exited": True,
            "killed": ["p1"],
            "seconds": 0.25,
        }
    ]
    rows = [
        _row("a", 4, 5.0, agents=tree, ee=ee),
        _row("b", 4, 5.0, agents={**tree, "p1": _agent("small")}, ee=ee),
    ]
    four = _by_setting(rows)[4]
    # small: 3 of 4 planned runs not killed; big: every run.
    assert four.activation_pct == {"small": 75.0, "big": 100.0}
    assert four.ee_overhead_share == pytest.approx(0.5 / 10.0)
    assert four.ee_seconds_mean == pytest.approx(0.25)
    assert four.warmups_per_sample == 3.0
    assert four.cached_token_ratio == pytest.approx(0.75)  # only agents with a precursor count
    assert four.latency_vs_1_median is None  # no reference rows


def test_exit_rate_leaves_moot_exits_out_and_critical_share_counts_exits_only():
    def d(q, exited=False, moot=False, wall=0.1):
        return {
            "cluster": "agg",
            "q": q,
            "exited": exited,
            "moot": moot,
            "killed": ["p1"] if exited else [],
            "seconds": 0.05,
            "wall_s": wall,
        }

    rows = [
        _row("a", 4, 10.0, ee=[d(None), d(0.9, exited=True, wall=0.2)]),
        _row("b", 4, 10.0, ee=[d(0.5), d(0.9, moot=True, wall=0.3), d(0.4)]),
    ]
    four = _by_setting(rows)[4]
    # Drawn, moot left out: 3 decisions, 1 exit; the moot one counted apart.
    assert four.ee_exit_rate == pytest.approx(1 / 3) and four.ee_moot == 1
    assert four.ee_critical_share == pytest.approx(0.2 / 20.0)
    assert four.ee_overhead_share == pytest.approx(0.25 / 20.0)
    text = _render(build_table(_by_setting(rows).values()))
    assert "33%" in text and "+1 moot" in text


def _render(table) -> str:
    console = Console(width=250, record=True)
    console.print(table)
    return console.export_text()


def test_settings_without_early_exit_have_no_ee_share():
    s = _by_setting([_row("a", 2, 1.0, agents={"p0": _agent("m")})])[2]
    assert s.ee_overhead_share is None and s.activation_pct == {"m": 100.0}
    assert s.cached_token_ratio is None


def test_a_run_rebuilds_its_summary_json_and_prints_a_table(tmp_path, capsys):
    writer = ResultsWriter(tmp_path / "results.jsonl")
    for row in make_rows(n=8, errors=1):
        writer.append(row)
    assert tmp_path / "summary.json" in rebuild(tmp_path)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert "median over samples" in on_disk["latency_normalization"]
    keyed = {(s["dataset"], s["setting"]): s for s in on_disk["settings"]}
    assert set(keyed) == {(d, s) for d in ("gsm8k", "math500") for s in (1, 2, 3, 4)}
    assert keyed[("gsm8k", 4)]["errors"] == 1 and keyed[("gsm8k", 4)]["n"] == 8
    # the synthetic tree is ~5.5x faster than dense in setting 4
    assert 0.1 < keyed[("gsm8k", 4)]["latency_vs_1_median"] < 0.25
    assert keyed[("gsm8k", 1)]["config"] == "all_to_all_9_9_1"
    assert "÷#1 med/mean" in capsys.readouterr().out


def test_table_shows_each_setting_and_the_normalization_note():
    rows = [validate_row(r) for r in make_rows(datasets=("gsm8k",), n=4)]
    console = Console(record=True, width=160)
    console.print(build_table(summarize(rows)))
    text = console.export_text()
    assert all(f"#{n}" in text for n in (1, 2, 3, 4))
    assert "median of per-sample ratios / ratio of means" in text


def test_mcnemar_exact_matches_the_binomial_test():
    from experiments.paired_stats import mcnemar

    stats = pytest.importorskip("scipy.stats")
    for a, b in [(0, 5), (1, 6), (3, 3), (7, 2), (0, 0), (10, 25)]:
        x = [True] * a + [False] * b + [True] * 4
        y = [False] * a + [True] * b + [True] * 4
        t = mcnemar(x, y)
        assert (t.n, t.only_a, t.only_b) == (a + b + 4, a, b)
        want = stats.binomtest(a, a + b, 0.5).pvalue if a + b else 1.0
        assert t.p_value == pytest.approx(want)
    with pytest.raises(ValueError, match="one entry per question"):
        mcnemar([True], [])


def test_bootstrap_ci_is_seeded_and_covers_the_statistic():
    from experiments.paired_stats import bootstrap_ci

    values = [0.8, 0.9, 1.0, 0.7, 0.85, 0.95, 0.75, 0.9]
    lo, hi = bootstrap_ci(values)
    assert lo <= float(np.median(values)) <= hi and lo < hi
    assert bootstrap_ci(values) == (lo, hi)  # same rows, same interval
    assert bootstrap_ci([2.0] * 5) == (2.0, 2.0)
    assert bootstrap_ci([1.0]) is None


def test_summary_gives_ratio_cis_and_paired_accuracy_tests():
    e2e3 = [10.0, 12.0, 9.0, 11.0, 10.0, 13.0]
    e2e4 = [8.0, 11.0, 9.5, 8.0, 7.5, 12.0]
    ok3 = [True, True, False, True, False, True]
    ok4 = [True, False, False, True, True, True]
    rows = [_row(f"q{i}", 3, e2e3[i], correct=ok3[i]) for i in range(6)]
    rows += [_row(f"q{i}", 4, e2e4[i], correct=ok4[i]) for i in range(6)]
    four = _by_setting(rows)[4]
    c = four.paired["vs_3"]
    ratios = [a / b for a, b in zip(e2e4, e2e3)]
    assert c["questions"] == 6 and c["latency_ratio_median"] == pytest.approx(np.median(ratios))
    lo, hi = c["latency_ratio_ci"]
    assert min(ratios) <= lo <= c["latency_ratio_median"] <= hi <= max(ratios)
    assert c["accuracy_diff"] == pytest.approx(0.0)  # one gained, one lost
    assert (c["only_this_correct"], c["only_ref_correct"], c["mcnemar_p"]) == (1, 1, 1.0)
    assert "vs_4" not in four.paired and "vs_1" not in four.paired  # no #1 rows
    assert "vs_3" not in _by_setting(rows)[3].paired  # never against itself
    text = _render(build_table(_by_setting(rows).values()))
    assert "+0.0pp vs #3" in text and "p=1.00" in text
    assert four.latency_vs_2_ci is None  # no #2 rows


def _stats(t: float, cpu: float, wakes_1ms: int, wakes_10ms: int, boot: str = "r1") -> dict:
    """A /v1/moa/stats snapshot: so many probe wakes within 1 ms and within 1-10 ms so far."""
    return {
        "boot_id": boot,
        "time_s": t,
        "cpu_s": cpu,
        "event_loop_lag": {
            "le": [0.001, 0.01, 0.1],
            "counts": [wakes_1ms, wakes_1ms + wakes_10ms, wakes_1ms + wakes_10ms],
            "count": wakes_1ms + wakes_10ms,
            "sum": 0.0,
        },
    }


def test_router_cpu_per_question_and_lag_quantiles_per_setting(tmp_path):
    from experiments.router_load import window, window_values

    def row(sid, setting, before, after, alone):
        w = window(before, after, alone)
        r = _row(sid, setting, 1.0).model_dump(mode="json")
        return validate_row(r | {"router": w.model_dump(mode="json"), **window_values(w)})

    rows = [
        # #2 at concurrency 1: two questions, one after the other, 0.3 and 0.5 CPU s; 200 wakes,
        # the last 2 of the second question 1-10 ms late (p99 = rank 198: within 1 ms).
        row("a", 2, _stats(0, 10.0, 0, 0), _stats(5, 10.3, 100, 0), alone=True),
        row("b", 2, _stats(6, 10.4, 100, 0), _stats(11, 10.9, 198, 2), alone=True),
        # #3 at concurrency 2: windows 20-30 and 22-32 overlap (one span, 2 CPU s in all) and
        # 40-45 is alone (1 CPU s): 3 s over 3 questions; 1 wake in 10 late: p99 in 10 ms.
        row("a", 3, _stats(20, 20.0, 0, 0), _stats(30, 21.5, 90, 9), alone=False),
        row("b", 3, _stats(22, 20.2, 10, 0), _stats(32, 22.0, 90, 10), alone=False),
        row("c", 3, _stats(40, 23.0, 90, 10), _stats(45, 24.0, 180, 20), alone=False),
        # #1 from an older runner: no router fields at all.
        _row("a", 1, 2.0),
    ]
    assert rows[0].router_cpu_s == pytest.approx(0.3) and rows[0].router_lag_p99_s == 0.001
    assert rows[2].router_cpu_s is None and rows[2].router_lag_p99_s is None
    s = _by_setting(rows)
    assert s[2].router_cpu_s_per_question == pytest.approx(0.4)
    assert (s[2].event_loop_lag_p50_s, s[2].event_loop_lag_p99_s) == (0.001, 0.001)
    assert s[2].event_loop_lag_samples == 200
    assert s[3].router_cpu_s_per_question == pytest.approx(1.0)
    assert (s[3].event_loop_lag_p50_s, s[3].event_loop_lag_p99_s) == (0.001, 0.01)
    assert s[3].event_loop_lag_samples == 200
    assert s[1].router_cpu_s_per_question is None and s[1].event_loop_lag_p99_s is None
    text = _render(build_table(list(s.values())))
    assert "0.40s/1ms" in text and "1.00s/10ms" in text and "router" in text

    writer = ResultsWriter(tmp_path / "results.jsonl")
    for r in rows:
        writer.append(r)
    rebuild(tmp_path)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert "upper bound of the bucket" in on_disk["router_load"]
    keyed = {s["setting"]: s for s in on_disk["settings"]}
    assert keyed[3]["event_loop_lag_p99_s"] == 0.01
    assert keyed[1]["router_cpu_s_per_question"] is None
