"""bench_warmup_timing's report: realized ÷ possible of each pipelined variant against blocking,
summed over the questions both ran in one block, the tokens the final requests prefilled, and
how many questions were token-identical; and the config edits of the timed and waiting variants."""

from __future__ import annotations

from benchmarks.bench_warmup_timing import policy_edit, report
from benchmarks.variant_blocks import warmup_fields
from router.config_loader import load_config

META = {"command": "x", "load_before": "0", "load_after": "0"}


def _row(q: str, variant: str, in_flight: float, exposed: float, uncached: float, outputs: str):
    return {
        "id": q,
        "position": 0,
        "variant": variant,
        "block": {"a": 0, "b": 1}[q],
        "concurrency": 1,
        "block_wall_s": in_flight,
        "in_flight_s": in_flight,
        "warmups": 0 if variant == "#2" else 20,
        "critical_path": {
            "leaf_prefill": 3.0,
            "exposed_prefill": exposed,
            "decode": in_flight - 3.0 - exposed,
            "other": 0.0,
        },
        "exposed_detail": {"uncached_tokens": uncached, "send_wait_s": 0.0},
        "outputs": outputs,
    }


def test_report_sums_realized_over_possible_and_counts_identical_questions():
    rows = [
        _row("a", "#2", 40.0, 4.0, 1000, "x"),
        _row("b", "#2", 50.0, 6.0, 1000, "y"),
        # Untimed (as shipped): 1 s and 2 s faster of 4 and 6 s possible: 0.30; b's tokens differ.
        _row("a", "#3", 39.0, 1.5, 80, "x"),
        _row("b", "#3", 48.0, 1.5, 90, "z"),
        # Timed: 3 s and 5 s faster: 0.80.
        _row("a", "#3-timed", 37.0, 0.8, 30, "x"),
        _row("b", "#3-timed", 45.0, 0.8, 40, "y"),
    ]
    text = report(rows, META)
    assert "| 1 | #3 | 3.0 of 10.0 s | 0.30 | 1 of 2 |" in text
    assert "| 1 | #3-timed | 8.0 of 10.0 s | 0.80 | 2 of 2 |" in text
    # Medians of the tokens the final requests prefilled, and of the router's send wait.
    assert "| 85.00 / 0.00 |" in text and "| 35.00 / 0.00 |" in text
    assert "| 1 | #3-timed | all | 2 | 0.913 [0.900, 0.925] |" in text  # 37/40 and 45/50


def test_the_edited_variants_keep_the_configs_other_warmup_settings():
    policy = load_config("tree_9_3_1_cpu").incremental_prefill
    timed = policy_edit("tree_9_3_1_cpu", "#3-timed")["incremental_prefill"]
    waits = policy_edit("tree_9_3_1_cpu", "#3-waits")["incremental_prefill"]
    assert timed["warm_before_cap"] is True and "final_beside_warmup" not in timed
    assert waits["final_beside_warmup"] is False and "warm_before_cap" not in waits
    assert timed["chunk_policy"] == waits["chunk_policy"] == policy.chunk_policy
    # The shipped defaults are the edits' opposites: untimed, the final request at once.
    assert not policy.warm_before_cap and policy.final_beside_warmup


def test_a_blocks_router_load_is_its_cpu_per_question_and_its_lag_p99():
    """warmup_fields from two router readings (router_metrics' keys, `stats` as GET
    /v1/moa/stats answers): CPU seconds per question and the lag p99 of the block's own probe
    wakes (cumulative buckets differenced), which the report prints as medians over blocks."""

    def stats(time_s: float, cpu_s: float, counts: list[int], count: int) -> dict:
        lag = {"le": [0.001, 0.01], "counts": counts, "count": count, "sum": 0.0}
        return {"boot_id": "b", "time_s": time_s, "cpu_s": cpu_s, "event_loop_lag": lag}

    before = {"warmups": 10.0, "stats": stats(0.0, 5.0, [90, 100], 100)}
    # The block: 200 wakes, 197 within 1 ms, 3 within 10 ms (p99 is the 198th: 10 ms).
    after = {"warmups": 30.0, "stats": stats(60.0, 13.0, [287, 300], 300), "slowdown.cpu": 0.02}
    f = warmup_fields(before, after, 4)
    assert f == {
        "warmups_per_q": 5.0,
        "slowdown.cpu": 0.02,
        "router_cpu_s_per_q": 2.0,
        "router_lag_p99_s": 0.01,
    }
    rows = [
        {**_row("a", "#2", 40.0, 4.0, 1000, "x"), **f},
        {**_row("b", "#2", 50.0, 6.0, 1000, "y"), **f, "router_cpu_s_per_q": 4.0},
    ]
    assert "| 3.00 / 10.00 |" in report(rows, META)
    # Rows from before the router's load was measured print "-".
    assert "| - / - |" in report([_row("a", "#2", 40.0, 4.0, 1000, "x")], META)
