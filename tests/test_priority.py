"""SGLang's priority scheduling in the reference engine (`--enable-priority-scheduling` and its
companion flags): the scheduler's rules with the order-sensitive fake model of test_scheduler, and
on a real prefill worker process, a queued warm-up-priority request overtaken by a later critical
one while a started prefill is never preempted."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import replace

import procs
import pytest
import requests
from test_scheduler import Collector, make_engine, make_req

from sglang_ext import protocol as P
from sglang_ext.engine.generate_io import parse_generate
from sglang_ext.engine.request import BadRequestError
from sglang_ext.server_args import UnsupportedFlagError, parse_args


def priority_engine(**flags):
    eng = make_engine(chunk=8, max_running=8)
    eng.cfg = replace(eng.cfg, enable_priority_scheduling=True, **flags)
    eng.sched.cfg = eng.cfg
    return eng


def run(eng, reqs: list[tuple[str, int, int | None]]) -> dict[str, float]:
    """Submit (rid, prompt length, priority) in order, step by hand; the forward_entry_time of
    each request."""
    cols, out = {}, {}
    for rid, n, prio in reqs:
        cols[rid] = Collector()
        req = make_req(rid, [1 + (hash(rid) + i) % 90 for i in range(n)], 1, cols[rid])
        req.priority = prio
        out[rid] = req
        eng.sched.add(req)
    for _ in range(200):
        if all(c.done.is_set() for c in cols.values()):
            break
        eng.step()
    assert all(c.last.status == 200 for c in cols.values())
    return {rid: req.time_stats.forward_entry_time for rid, req in out.items()}


def test_waiting_queue_is_sorted_by_priority_then_arrival():
    t = run(priority_engine(), [("w1", 8, 0), ("w2", 8, 0), ("c", 8, 5), ("none", 8, None)])
    assert t["c"] < t["w1"] < t["w2"] < t["none"]  # no priority: the lowest possible value


def test_low_values_first_and_default_value():
    eng = priority_engine(schedule_low_priority_values_first=True, default_priority_value=3)
    t = run(eng, [("five", 8, 5), ("none", 8, None), ("one", 8, 1)])
    assert t["one"] < t["none"] < t["five"]  # `none` got the default value 3


def test_a_started_prefill_is_never_preempted():
    eng = priority_engine()
    cols = {rid: Collector() for rid in ("a", "c")}
    a = make_req("a", list(range(1, 41)), 1, cols["a"])  # 5 chunks of 8
    a.priority = 0
    eng.sched.add(a)
    eng.step()  # a's first chunk: it has started
    c = make_req("c", [7, 8, 9], 1, cols["c"])
    c.priority = 100
    eng.sched.add(c)
    while not cols["c"].done.is_set():
        eng.step()
    assert cols["a"].done.is_set()  # a ran on to its end first
    assert c.time_stats.forward_entry_time > a.time_stats.prefill_finished_time


def test_priority_on_a_server_without_priority_scheduling():
    eng = make_engine()
    col = Collector()
    req = make_req("p", [1, 2, 3], 1, col)
    req.priority = 1
    eng.sched.add(req)  # ignored without --abort-on-priority-when-disabled
    assert "p" in eng.reqs
    eng.cfg = replace(eng.cfg, abort_on_priority_when_disabled=True)
    eng.sched.cfg = eng.cfg
    col = Collector()
    req = make_req("q", [1, 2, 3], 1, col)
    req.priority = 1
    eng.sched.add(req)
    assert col.last.status == 503 and col.last.finish_reason["message"] == (
        P.PRIORITY_DISABLED_MESSAGE
    )


def test_priority_must_be_an_int():
    cfg = make_engine().cfg
    req, _ = parse_generate({"input_ids": [1, 2], P.PRIORITY: -3}, cfg, None)
    assert req.priority == -3
    for bad in ("high", 1.5, True):
        with pytest.raises(BadRequestError, match="priority"):
            parse_generate({"input_ids": [1, 2], P.PRIORITY: bad}, cfg, None)


def test_cli_takes_sglang_priority_flags():
    args = parse_args(
        [
            "--model-path",
            "m",
            "--enable-priority-scheduling",
            "--schedule-low-priority-values-first",
            "--default-priority-value",
            "7",
            "--abort-on-priority-when-disabled",
            "--disable-priority-preemption",
        ]
    )
    assert args.enable_priority_scheduling and args.schedule_low_priority_values_first
    assert args.default_priority_value == 7 and args.abort_on_priority_when_disabled
    with pytest.raises(UnsupportedFlagError, match="--priority-scheduling-preemption-threshold"):
        parse_args(["--model-path", "m", "--priority-scheduling-preemption-threshold", "5"])


# --- a real prefill worker ------------------------------------------------------------------------
def _warmup(url: str, ids: list[int], priority: int, out: dict, rid: str) -> None:
    body = {
        P.INPUT_IDS: ids,
        P.SAMPLING_PARAMS: {P.MAX_NEW_TOKENS: 1, P.TEMPERATURE: 0.0},
        P.RID: rid,
        P.BOOTSTRAP_HOST: P.FAKE_BOOTSTRAP_HOST,
        P.BOOTSTRAP_ROOM: random.randrange(2**62),
        P.PRIORITY: priority,
    }
    r = requests.post(url + "/generate", json=body, timeout=120)
    out[rid] = r.json()[P.META_INFO] if r.status_code == 200 else r.text


def _round(url: str, rng: random.Random, critical: int) -> dict[str, dict]:
    """A long prefill `a` starts; warm-ups w1, w2 queue; then `c` arrives with `critical`."""
    out: dict = {}
    lengths = {"a": 320, "w1": 32, "w2": 32, "c": 32}  # a: 20 full chunks of 16
    threads = []
    for rid, n in lengths.items():
        ids = [rng.randrange(1000, 40000) for _ in range(n)]
        prio = critical if rid == "c" else P.PRIORITY_WARMUP
        th = threading.Thread(target=_warmup, args=(url, ids, prio, out, rid))
        th.start()
        threads.append(th)
        time.sleep(0.05)  # arrival order a, w1, w2, c
    for th in threads:
        th.join(150)
    bad = {rid: m for rid, m in out.items() if not isinstance(m, dict)}
    assert len(out) == 4 and not bad, bad
    a, c = out["a"], out["c"]
    # The scenario held: c arrived while a was still prefilling (else nothing was queued).
    assert c[P.REQUEST_RECEIVED_TS] < a[P.PREFILL_FINISHED_TIME], "a ended before c arrived"
    return out


@pytest.mark.slow
def test_critical_request_overtakes_queued_warmups_on_a_prefill_worker(smollm2_dir, tmp_path):
    worker = procs.start_worker(
        "prefill-prio",
        smollm2_dir,
        tmp_path,
        "prefill",
        [
            "--enable-priority-scheduling",
            "--page-size",
            "4",
            "--max-total-tokens",
            "4096",
            "--chunked-prefill-size",
            "16",
            "--max-prefill-tokens",
            "16",
        ],
    )
    try:
        procs.wait_healthy([worker])
        rng = random.Random(0)
        t = _round(worker.url, rng, P.PRIORITY_CRITICAL)
        fwd = {rid: m[P.FORWARD_ENTRY_TIME] for rid, m in t.items()}
        assert fwd["a"] < fwd["c"] < fwd["w1"] < fwd["w2"]
        assert t["c"][P.PREFILL_FINISHED_TIME] <= fwd["w1"]  # c ran before w1 started
        assert fwd["c"] >= t["a"][P.PREFILL_FINISHED_TIME]  # a was not preempted
        assert t["w1"][P.QUEUE_TIME] > t["c"][P.QUEUE_TIME]
        # Control: at equal priority the same arrivals are served first come, first served.
        t = _round(worker.url, rng, P.PRIORITY_WARMUP)
        fwd = {rid: m[P.FORWARD_ENTRY_TIME] for rid, m in t.items()}
        assert fwd["a"] < fwd["w1"] < fwd["w2"] < fwd["c"]
    finally:
        procs.stop(worker)
