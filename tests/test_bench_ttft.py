"""The TTFT benchmark's pure parts: argument parsing, the interleaved order, the paired summary,
the model choice; and device_name labelling numbers with the card (a fake nvidia-smi)."""

import argparse
import os
import stat

import pytest

from benchmarks.bench_meta import device_name
from benchmarks.bench_ttft import (
    BenchError,
    order,
    parse_ints,
    parse_paths,
    pick_model,
    worker_timing,
)
from benchmarks.ttft_summary import format_table, summarize
from router.cluster import ClusterSpec


def test_lengths_and_paths_parse_or_say_what_is_wrong():
    assert parse_ints("256, 1024,4096", "--lengths") == [256, 1024, 4096]
    for bad in ("", "0,256", "1k"):
        with pytest.raises(argparse.ArgumentTypeError, match="--lengths"):
            parse_ints(bad, "--lengths")
    assert parse_paths("dual,router") == ["router", "dual"]
    with pytest.raises(argparse.ArgumentTypeError, match="router,dual"):
        parse_paths("router,native")


def test_cold_and_warm_alternate_first_per_repetition():
    assert order(0, ["router", "dual"]) == [
        ("cold", "router"),
        ("cold", "dual"),
        ("warm", "router"),
        ("warm", "dual"),
    ]
    assert [c for c, _ in order(1, ["router"])] == ["warm", "cold"]


def _row(rep, length, cond, path, ttft, cached=0):
    return {
        "rep": rep,
        "prompt_tokens": length,
        "condition": cond,
        "path": path,
        "ttft_s": ttft,
        "cached_tokens": cached,
    }


def test_summary_pairs_cold_and_warm_of_one_repetition():
    rows = [
        _row(0, 256, "cold", "router", 0.050),
        _row(0, 256, "warm", "router", 0.040, 224),
        _row(1, 256, "cold", "router", 0.060),
        _row(1, 256, "warm", "router", 0.030, 224),
        _row(2, 256, "cold", "router", 0.070),  # its warm half is missing: left out
        _row(0, 1024, "cold", "dual", 0.100),
        _row(0, 1024, "warm", "dual", 0.050, 992),
    ]
    s = summarize(rows)
    assert [(x["path"], x["prompt_tokens"], x["n"]) for x in s] == [
        ("router", 256, 2),
        ("dual", 1024, 1),
    ]
    r = s[0]
    assert r["cold_ttft_ms"] == pytest.approx(55.0)
    assert r["warm_ttft_ms"] == pytest.approx(35.0)
    assert r["saved_ms"] == pytest.approx(20.0)  # median of 10 and 30
    assert r["warm_over_cold"] == pytest.approx((0.8 + 0.5) / 2)
    assert r["warm_cached_tokens"] == 224 and r["cold_cached_tokens"] == 0
    table = format_table(s)
    assert "| router | 256 | 2 | 55.0 | 35.0 | 20.0 | 0.650 | 224 / 0 | ? / ? |" in table
    assert r["breakdown_ms"]["cold"]["bootstrap"] == "unknown"  # rows without worker timings


def _timed(rep, cond, sent, prefill_queued, t):
    """A dual-path row sent at Unix `sent` whose parts take t = (bootstrap, prefill queue,
    prefill compute, KV transfer, first decode step, to router) seconds."""
    c = [sent + sum(t[:i]) for i in range(len(t) + 1)]  # the seven cut points
    timing = {
        "prefill.queue_time": c[2] - c[1],
        "prefill.forward_entry_time": c[2],
        "prefill.prefill_finished_time": c[3],
        "decode.queue_time": 0.001,
        "decode.forward_entry_time": c[4] + 0.001,
        "decode.response_sent_to_client_ts": c[5],
    }
    assert prefill_queued == c[1]
    row = _row(rep, 512, cond, "dual", c[6] - sent)
    return {**row, "sent_unix": sent, "first_token_unix": c[6], "worker_timing": timing}


def test_summary_reports_the_median_pd_breakdown_per_condition():
    cold = [(0.002, 0.001, 0.040, 0.004, 0.010, 0.001), (0.004, 0.001, 0.060, 0.006, 0.010, 0.001)]
    warm = [(0.002, 0.001, 0.005, 0.004, 0.010, 0.001), (0.002, 0.001, 0.007, 0.004, 0.010, 0.001)]
    rows = []
    for rep, (c, w) in enumerate(zip(cold, warm)):
        sent = 1.7e9 + 10 * rep
        rows.append(_timed(rep, "cold", sent, sent + c[0], c))
        rows.append(_timed(rep, "warm", sent + 5, sent + 5 + w[0], w))
    (s,) = summarize(rows)
    b = s["breakdown_ms"]
    assert b["cold"]["prefill_compute"] == pytest.approx(50.0, abs=1e-3)
    assert b["warm"]["prefill_compute"] == pytest.approx(6.0, abs=1e-3)
    assert b["cold"]["bootstrap"] == pytest.approx(3.0, abs=1e-3)
    assert b["cold"]["kv_transfer"] == pytest.approx(5.0, abs=1e-3)
    assert b["warm"]["first_decode_step"] == pytest.approx(10.0, abs=1e-3)
    assert b["cold"]["unattributed"] == pytest.approx(0.0, abs=1e-3)
    assert b["cold"]["ttft"] == pytest.approx(s["cold_ttft_ms"], abs=1e-3)
    row = next(x for x in format_table([s]).splitlines() if x.startswith("| dual"))
    assert "| 50.0 / 6.0 |" in row and "| 5.0 / 4.0 |" in row and row.endswith("| 0.0 / 0.0 |")


def test_worker_timing_prefixes_the_numbers_of_both_sides():
    t = worker_timing(
        {"queue_time": 0.01, "forward_entry_time": 100.0, "id": "r", "finish_reason": None},
        {"response_sent_to_client_ts": 100.5, "cached_tokens": 0},
        {"response_sent_to_client_ts": 101.0, "request_finished_ts": 102.0, "x": True},
    )
    assert t == {
        "prefill.queue_time": 0.01,
        "prefill.forward_entry_time": 100.0,
        "decode.response_sent_to_client_ts": 100.5,  # the first chunk's own
        "decode.cached_tokens": 0.0,
        "decode.request_finished_ts": 102.0,
    }


def _cluster(*names):
    model = {"router_url": "http://r", "prefill_urls": ["http://p"], "decode_urls": ["http://d"]}
    return ClusterSpec.model_validate(
        {"models": {n: {**model, "tokenizer_path": "t"} for n in names}}
    )


def test_model_is_the_only_one_or_must_be_named():
    assert pick_model(_cluster("a"), None, "c.json") == "a"
    with pytest.raises(BenchError, match="serves 2 models .*--model"):
        pick_model(_cluster("a", "b"), None, "c.json")
    with pytest.raises(BenchError, match="no model 'x'"):
        pick_model(_cluster("a", "b"), "x", "c.json")


def test_device_name_is_the_gpu_when_nvidia_smi_answers(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200, 143771 MiB'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert device_name() == "1x NVIDIA H200 (143771 MiB)"
    monkeypatch.setenv("PATH", "/nonexistent")
    assert device_name().startswith("CPU")


def test_bench_against_a_running_pd_pair_times_both_paths_and_hits_the_warmup(stack, tmp_path):
    """The whole benchmark against the session's real PD pair (reference engine, page size 4)
    behind the real sglang-router: every (condition, path) row, cold requests find nothing
    cached, warm ones find the warm-up's whole-page prefix, raw meta_info kept."""
    import json

    from benchmarks.bench_ttft import main

    cluster = {
        "backend": "torch",
        "models": {
            "smollm2": {
                "router_url": stack.router.url,
                "prefill_urls": [stack.prefill.url],
                "decode_urls": [stack.decode.url],
                "bootstrap_ports": [stack.prefill.bootstrap_port],
                "model_path": stack.model_dir,
                "tokenizer_path": stack.model_dir,
            }
        },
    }
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(cluster))
    out = tmp_path / "out"
    argv = ["--cluster", str(path), "--lengths", "40", "--reps", "2", "--tail", "10"]
    assert main([*argv, "--output-len", "2", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert sorted((r["rep"], r["condition"], r["path"]) for r in rows) == sorted(
        (rep, c, p) for rep in (0, 1) for c in ("cold", "warm") for p in ("router", "dual")
    )
    for r in rows:
        assert r["ttft_s"] > 0 and r["latency_s"] >= r["ttft_s"]
        assert r["meta_last"]["completion_tokens"] == 2
        if r["condition"] == "cold":
            assert r["cached_tokens"] == 0 and r["warmup_tokens"] == 0
        else:
            assert r["warmup_tokens"] == 30 and r["cached_tokens"] == 28  # whole pages of 4
        if r["path"] == "dual":
            assert r["prefill_meta"]["prompt_tokens"] == 40 and r["prefill_reply_s"] > 0
    summary = json.loads((out / "summary.json").read_text())
    assert [(s["path"], s["n"]) for s in summary["summary"]] == [("router", 2), ("dual", 2)]
    assert summary["meta"]["device"].startswith("CPU") and summary["meta"]["model"] == "smollm2"
    assert summary["meta"]["rows_with_worker_timing"] == len(rows)  # the engine reports them
    assert "| dual | 40 | 2 |" in (out / "ttft.md").read_text()
    dual = summary["summary"][1]["breakdown_ms"]
    for cond in ("cold", "warm"):  # the engine reports every part on the dual path
        assert all(isinstance(dual[cond][k], float) for k in ("prefill_compute", "kv_transfer"))
    router = summary["summary"][0]["breakdown_ms"]["cold"]
    assert router["prefill_compute"] == "unknown"  # the native router drains prefill's reply
    assert isinstance(router["first_decode_step"], float)
