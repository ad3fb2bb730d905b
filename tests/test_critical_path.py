"""Critical-path breakdown, overlap gain and the per-question timeline, on hand-made traces."""

from __future__ import annotations

import pytest

from experiments.critical_path import breakdown, critical_path, gain_by_part, overlap_gain
from experiments.results import ResultRow
from experiments.summary import summarize
from experiments.timeline import pick_question, plot_timeline, timeline_figure


def agent(layer, start, request, first, end, order=(), warm=()):
    return {
        "model": "m",
        "layer": layer,
        "start_s": start,
        "final_request_s": request,
        "first_token_s": first,
        "end_s": end,
        "slot_order": list(order),
        "warmup_spans": [list(w) for w in warm],
        "output_ids": [1],
    }


def row(setting: int, mode: str, agg_wait: float, sid: str = "q0") -> ResultRow:
    """3-1 tree: leaves end at 2, 3 and 5 s; the aggregator's request goes at 5 s and its first
    token comes `agg_wait` later; it decodes for 1 s."""
    agents = {
        "l0": agent(1, 0, 0, 0.5, 2.0),
        "l1": agent(1, 0, 0, 0.5, 3.0),
        "l2": agent(1, 0, 0, 0.6, 5.0),
        "agg": agent(
            2,
            0,
            5.0,
            5.0 + agg_wait,
            6.0 + agg_wait,
            order=("l0", "l1", "l2"),
            warm=[(0.7, 0.8, 40, 0), (3.1, 3.3, 90, 40)] if mode == "pipelined" else [],
        ),
    }
    return ResultRow.model_validate(
        {
            "sample_id": sid,
            "dataset": "gsm8k",
            "setting": setting,
            "mode": mode,
            "e2e_s": 6.1 + agg_wait,
            "agents": agents,
        }
    )


def test_the_path_runs_through_the_precursor_that_ended_last():
    r = row(2, "blocking", 2.0)
    assert critical_path(r.agents, "agg") == ["l2", "agg"]
    parts = breakdown(r)
    assert parts["leaf_prefill"] == pytest.approx(0.6)
    assert parts["exposed_prefill"] == pytest.approx(2.0)
    assert parts["decode"] == pytest.approx(4.4 + 1.0)
    assert parts["other"] == pytest.approx(0.1)


def test_overlap_gain_pairs_questions_and_compares_with_blockings_exposed_prefill():
    rows = [
        row(2, "blocking", 2.0),
        row(3, "pipelined", 0.4),
        row(2, "blocking", 1.0, "q1"),
        row(3, "pipelined", 0.2, "q1"),
    ]
    gain = overlap_gain(rows, "gsm8k", 3, 2)
    assert gain.questions == 2
    assert gain.possible_s == pytest.approx(3.0)
    assert gain.realized_s == pytest.approx(1.6 + 0.8)
    assert gain.realized_over_possible == pytest.approx(0.8)
    by_setting = {s.setting: s for s in summarize(rows)}
    assert by_setting[2].overlap_gain is None
    assert by_setting[3].overlap_gain["realized_over_possible"] == pytest.approx(0.8)
    assert by_setting[3].critical_path_s["exposed_prefill"] == pytest.approx(0.3)


def test_old_traces_without_request_times_give_no_breakdown():
    r = row(2, "blocking", 2.0)
    r.agents["agg"].final_request_s = None
    assert breakdown(r) is None


def test_timeline_is_drawn_for_a_question_every_setting_ran(tmp_path):
    rows = [row(2, "blocking", 2.0), row(3, "pipelined", 0.4), row(3, "pipelined", 0.4, "q1")]
    assert pick_question(rows) == "q0"
    path = plot_timeline(rows, tmp_path / "fig_timeline.png")
    assert path.stat().st_size > 10_000
    assert plot_timeline([row(2, "blocking", 1.0)][:0], tmp_path / "none.png") is None


def test_each_timeline_panel_lists_its_own_settings_agents():
    """#1 runs the dense topology, whose agent ids differ from the tree's: every panel must draw
    its own row's agents, and an aggregator cut before its final request shows only waiting."""
    tree = row(3, "pipelined", 0.4)
    tree.agents["agg"].killed = True
    tree.agents["agg"].final_request_s = None
    dense = ResultRow.model_validate(
        {
            "sample_id": "q0",
            "dataset": "gsm8k",
            "setting": 1,
            "mode": "blocking",
            "e2e_s": 9.0,
            "agents": {"d0": agent(1, 0, 0, 0.5, 4.0), "dagg": agent(2, 0, 4.0, 7.0, 9.0, ("d0",))},
        }
    )
    fig = timeline_figure([dense, tree], "q0")
    ax_dense, ax_tree = fig.axes[:2]
    assert [t.get_text() for t in ax_dense.get_yticklabels()] == ["dagg", "d0"]
    assert [t.get_text() for t in ax_tree.get_yticklabels()] == ["agg", "l2", "l1", "l0"]
    # Leaves: prefill and decode each; the cut aggregator: its wait only; its two warm-ups.
    assert len(ax_tree.collections) == 3 * 2 + 1 + 2
    assert len(ax_tree.lines) == 1  # the kill mark


def test_gain_by_part_sums_pipelined_minus_blocking_per_part_and_decode_layer():
    """The overlap shows as exposed prefill saved; a leaf that decodes 0.5 s longer beside the
    warm-ups shows as layer-1 decode given back."""
    slow_leaf = row(3, "pipelined", 0.4)
    slow_leaf.agents["l2"].end_s = 5.5
    slow_leaf.agents["agg"].final_request_s = 5.5
    slow_leaf.agents["agg"].first_token_s = 5.9
    slow_leaf.agents["agg"].end_s = 6.9
    slow_leaf.e2e_s = 7.0
    rows = [row(2, "blocking", 2.0), slow_leaf, row(2, "blocking", 1.0, "q1")]
    moved = gain_by_part(rows, 3, 2)
    assert moved["exposed_prefill"] == pytest.approx(0.4 - 2.0)
    assert moved["decode_layer_1"] == pytest.approx(0.5)
    assert moved["decode_layer_2"] == pytest.approx(0.0)
    assert moved["decode"] == pytest.approx(0.5)
    assert moved["leaf_prefill"] == pytest.approx(0.0)
    assert gain_by_part(rows[:1], 3, 2) is None  # no question ran in both
