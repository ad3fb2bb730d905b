"""`moa-pd run` end to end on real processes: tree_3_1_cpu (real PD pair, sglang-router and
shell router, started by the runner itself) for 2 GSM8K questions and settings 2, 3, 4, then
`moa-pd plot`; checks the rows, the traces (times in order on one clock, lining up with the
runner's wall clock, every agent's prompt and cached tokens as the workers reported them), the
summary and the figures. Outputs are capped at a few tokens to keep it short."""

from __future__ import annotations

import json

import pytest

from experiments.results import read_results
from launch.cli import main as cli_main
from router.config_loader import load_config

# Leaves of different lengths, so the cluster's agents finish at different times.
LEAF_TOKENS = {"leaf_0_0": 6, "leaf_0_1": 10, "leaf_0_2": 14}


def small_config(tmp_path) -> str:
    cfg = load_config("tree_3_1_cpu")
    raw = json.loads(cfg.model_dump_json(exclude_none=True))
    raw["name"] = "tree_3_1_cpu_e2e"
    raw["sampling"]["max_new_tokens"] = 8
    for agent in raw["agents"]:
        agent["sampling"] = {"max_new_tokens": LEAF_TOKENS.get(agent["id"], 8)}
    path = tmp_path / "tree_3_1_cpu_e2e.json"
    path.write_text(json.dumps(raw))
    return str(path)


def check_trace(row) -> None:
    """Every agent of a row: start ≤ first token ≤ end ≤ e2e on the session clock, the prompt
    and cached tokens the workers reported, and the session starting within the runner's call."""
    where = f"{row.sample_id} #{row.setting}"
    assert row.started_at is not None and row.session_started_at is not None, where
    # The router's session clock starts inside the runner's call (same host, one wall clock).
    assert row.started_at - 0.05 <= row.session_started_at <= row.started_at + row.e2e_s, where
    for aid, a in row.agents.items():
        at = f"{where} {aid}"
        assert a.start_s is not None and a.end_s is not None, at
        assert 0.0 <= a.start_s <= a.end_s <= row.e2e_s, at
        if a.killed:
            continue
        assert a.output_ids and a.first_token_s is not None, at
        assert a.start_s <= a.first_token_s <= a.end_s, at
        # More than one token came back: the last arrives after the first.
        if len(a.output_ids) > 1:
            assert a.first_token_s < a.end_s, at
        assert a.final_request_s is not None and a.start_s <= a.final_request_s <= a.first_token_s
        assert a.prompt_tokens and a.prompt_tokens > 0, at
        assert a.cached_tokens is not None and 0 <= a.cached_tokens <= a.prompt_tokens, at


@pytest.mark.slow
@pytest.mark.deployment
def test_moa_pd_run_then_plot_on_real_processes(tmp_path):
    out = tmp_path / "run"
    rc = cli_main(
        [
            "run",
            "--config",
            small_config(tmp_path),
            "--dataset",
            "gsm8k",
            "--num-samples",
            "2",
            "--settings",
            "2,3,4",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    rows = read_results(out / "results.jsonl")
    assert sorted((r.sample_id, r.setting) for r in rows) == sorted(
        (f"gsm8k-test-{i:04d}", s) for i in range(2) for s in (2, 3, 4)
    )
    for r in rows:
        assert r.ok, r.error
        assert r.config == "tree_3_1_cpu_e2e" and r.correct is not None and r.final_text
        assert set(r.agents) == {"leaf_0_0", "leaf_0_1", "leaf_0_2", "final"}
        check_trace(r)
        assert r.mode == ("blocking" if r.setting == 2 else "pipelined")
        # Early exit decided in #4 (and only there), on real MiniLM embeddings.
        assert bool(r.early_exit) == (r.setting == 4)
        assert all(d.exited == bool(d.killed) and not (d.exited and d.moot) for d in r.early_exit)
    # Pipelined successors were warmed: their final prompt hit the cache.
    finals = [r.agents["final"] for r in rows if r.setting == 3]
    assert all(f.warmups > 0 and f.cached_tokens > 0 for f in finals)

    summary = json.loads((out / "summary.json").read_text())
    by_setting = {s["setting"]: s for s in summary["settings"]}
    assert set(by_setting) == {2, 3, 4}
    assert all(s["n"] == 2 and s["errors"] == 0 for s in by_setting.values())
    three = by_setting[3]
    assert three["latency_vs_2_median"] > 0 and len(three["latency_vs_2_ci"]) == 2
    assert three["paired"]["vs_2"]["graded"] == 2
    assert by_setting[4]["ee_overhead_share"] is not None
    for name in (
        "fig_latency_accuracy.png",
        "fig_latency_cdf.png",
        "fig_timeline.png",
        "fig_activation_ee.png",
    ):
        (out / name).unlink()
    assert cli_main(["plot", str(out), "--dpi", "40"]) == 0
    for name in (
        "fig_latency_accuracy.png",
        "fig_latency_cdf.png",
        "fig_timeline.png",
        "fig_activation_ee.png",
    ):
        assert (out / name).stat().st_size > 1000, name
