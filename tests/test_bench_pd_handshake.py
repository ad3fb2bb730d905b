"""bench_pd_handshake's cut of a probe's timings and its report (the benchmark itself runs on a
deployment: docs/benchmarks.md)."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.bench_pd_handshake import cut, main, report
from sglang_ext import protocol as P


def _meta(received, forward, queue, finished=None):
    m = {P.REQUEST_RECEIVED_TS: received, P.FORWARD_ENTRY_TIME: forward, P.QUEUE_TIME: queue}
    if finished is not None:
        m[P.PREFILL_FINISHED_TIME] = finished
    return m


def test_cut_takes_the_later_arrival_and_each_side_queue_entry():
    prefill = _meta(100.000, 100.050, 0.010, finished=100.500)  # queued at 100.040
    decode = _meta(100.002, 100.530, 0.0)  # the KV arrived at 100.530
    parts = cut(prefill, decode)
    assert parts["handshake_ms"] == pytest.approx(38.0)
    assert parts["transfer_ms"] == pytest.approx(30.0)
    del decode[P.QUEUE_TIME]
    assert cut(prefill, decode) is None


def test_report_has_a_row_per_state_with_median_and_range():
    rows = [{"handshake_ms": h, "transfer_ms": t} for h, t in ((3, 8), (5, 9), (40, 90))]
    args = argparse.Namespace(prompt_tokens=480, streams=8, stream_tokens=96)
    md = report({"fresh": rows, "after_streams": rows[:1]}, args)
    assert "| fresh | 3 | 5.0 (3.0-40.0) | 9.0 (8.0-90.0) |" in md
    assert "| after_streams | 1 | 3.0 (3.0-3.0) | 8.0 (8.0-8.0) |" in md


def test_a_missing_cluster_file_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--cluster", str(tmp_path / "none.json")])
    assert e.value.code == 2 and "no such file" in capsys.readouterr().err
