"""Where a PD request's time to first token goes (experiments/pd_breakdown.py), on synthetic
traces with known timings: each request's parts, the critical path's sum per kind, "unknown"
where a worker did not report, the summary's medians and the timeline's split prefill bars."""

from __future__ import annotations

import pytest

from experiments.pd_breakdown import COMPONENTS, UNKNOWN, path_breakdown, request_breakdown
from experiments.results import AgentTrace, ResultRow
from experiments.summary import summarize
from experiments.timeline import PD_COLORS, timeline_figure
from tests.synthetic_results import PD_PARTS, SESSION_T0, make_rows, worker_timing

US = 1e-6  # Unix times near 1.7e9 s resolve about 0.2 us


def trace(request_s: float, parts=PD_PARTS, leaf: bool = False, order=()) -> AgentTrace:
    return AgentTrace.model_validate(
        {
            "model": "m",
            "layer": 1 if leaf else 2,
            "start_s": 0.0,
            "final_request_s": request_s,
            "first_token_s": request_s + sum(parts),
            "end_s": request_s + sum(parts) + 1.0,
            "slot_order": list(order),
            "worker_timing": worker_timing(request_s, parts, leaf),
        }
    )


def test_a_successors_request_splits_into_its_known_parts():
    parts = (0.004, 0.02, 0.3, 0.05, 0.01, 0.003)
    b = request_breakdown(trace(2.5, parts, order=("l0",)), SESSION_T0)
    assert [b[k] for k in COMPONENTS] == pytest.approx(parts, abs=US)
    assert b["ttft"] == pytest.approx(sum(parts), abs=US)
    assert b["unattributed"] == pytest.approx(0.0, abs=US)


def test_a_leaf_through_the_native_router_has_only_decodes_side():
    b = request_breakdown(trace(0.0, leaf=True), SESSION_T0)
    assert [b[k] for k in COMPONENTS[-2:]] == pytest.approx(PD_PARTS[-2:], abs=US)
    assert all(b[k] is None for k in COMPONENTS[:-2])
    # The unknown parts together: the TTFT the workers did not account for, no made-up split.
    assert b["unattributed"] == pytest.approx(sum(PD_PARTS[:-2]), abs=US)


def test_without_worker_timings_or_a_session_start_every_part_is_unknown():
    a = trace(1.0, order=("l0",))
    assert all(request_breakdown(a, None)[k] is None for k in COMPONENTS)
    a.worker_timing = {}
    b = request_breakdown(a, SESSION_T0)
    assert all(b[k] is None for k in COMPONENTS) and b["unattributed"] == pytest.approx(0.1, abs=US)
    a.first_token_s = None  # no first token: no TTFT to split
    assert request_breakdown(a, SESSION_T0) is None


def _row(agents: dict[str, AgentTrace]) -> ResultRow:
    return ResultRow(
        sample_id="q0",
        dataset="gsm8k",
        setting=3,
        e2e_s=10.0,
        session_started_at=SESSION_T0,
        agents=agents,
        mode="pipelined",
    )


def test_the_critical_paths_requests_are_summed_per_kind():
    # l1 ends last, so the path is l1 -> agg -> final; l0 is off the path.
    agg_parts, final_parts = (0.01, 0.02, 0.1, 0.03, 0.01, 0.0), (0.02, 0.0, 0.2, 0.04, 0.02, 0.01)
    agents = {
        "l0": trace(0.0, (0.1, 0.1, 0.1, 0.1, 0.5, 0.1), leaf=True),
        "l1": trace(0.0, leaf=True),
        "agg": trace(3.0, agg_parts, order=("l0", "l1")),
        "final": trace(6.0, final_parts, order=("agg",)),
    }
    agents["l0"].end_s, agents["l1"].end_s = 1.5, 2.9
    got = path_breakdown(_row(agents))
    for k, a, f in zip(COMPONENTS, agg_parts, final_parts):
        assert got["exposed_prefill"][k] == pytest.approx(a + f, abs=US), k
    assert got["leaf_prefill"]["first_decode_step"] == pytest.approx(PD_PARTS[-2], abs=US)
    assert got["leaf_prefill"]["prefill_compute"] is None
    # A successor on the path whose prefill reply is missing makes its sum unknown.
    agents["final"].worker_timing = worker_timing(6.0, final_parts, leaf=True)
    assert path_breakdown(_row(agents))["exposed_prefill"]["prefill_compute"] is None


def test_summary_json_reports_the_median_parts_per_setting():
    rows = [ResultRow.model_validate(r) for r in make_rows(settings=(2, 3, 7), n=4)]
    for s in summarize(rows):
        pd = s.pd_breakdown_s
        exposed, leaf = pd["exposed_prefill"], pd["leaf_prefill"]
        # Two successors on each path (an aggregator and the final), one leaf.
        for k, v in zip(COMPONENTS, PD_PARTS):
            assert exposed[k] == pytest.approx(2 * v, abs=US), k
        assert exposed["ttft"] == pytest.approx(2 * sum(PD_PARTS), abs=US)
        assert leaf["to_router"] == pytest.approx(PD_PARTS[-1], abs=US)
        assert leaf["prefill_compute"] == UNKNOWN and leaf["rows"] == exposed["rows"] == 4


def test_the_timeline_splits_each_prefill_bar_into_its_parts(tmp_path):
    rows = [ResultRow.model_validate(r) for r in make_rows(settings=(2, 3), n=1)]
    fig = timeline_figure(rows, "gsm8k-0")
    colors = {
        tuple(round(c, 3) for c in col.get_facecolor()[0])
        for ax in fig.axes
        for col in ax.collections
    }
    from matplotlib.colors import to_rgba

    for name, color in PD_COLORS.items():
        assert tuple(round(c, 3) for c in to_rgba(color)) in colors, name
    labels = {t.get_text() for t in fig.legends[0].get_texts()}
    assert {"prefill compute", "kv transfer", "first decode step", "to router"} <= labels
    fig.savefig(tmp_path / "fig_timeline.png")
    assert (tmp_path / "fig_timeline.png").stat().st_size > 10_000
