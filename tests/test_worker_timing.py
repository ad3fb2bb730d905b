"""The timing keys of SGLang's meta_info (queue_time, forward_entry_time, prefill_finished_time,
request_received_ts, request_finished_ts, ...) as the reference engine reports them: the
conversion, the order of the stamps in one engine, and the replies of real null and PD workers
(the prefill reply of a PD request ends only once its KV reached decode)."""

from __future__ import annotations

import concurrent.futures
import random
import time

import pytest
import requests
from test_scheduler import Collector, make_engine, make_req

from router.agent_runner import worker_timing
from sglang_ext import protocol as P
from sglang_ext.engine.time_stats import ReqTimeStats


def test_meta_info_turns_stamps_into_unix_times_and_spans():
    ts = ReqTimeStats(
        created_time=10.0,
        api_server_dispatch_finish_time=10.1,
        wait_queue_entry_time=10.5,
        forward_entry_time=11.0,
        prefill_run_batch_start_time=11.5,
        prefill_run_batch_end_time=11.75,
        prefill_finished_time=11.75,
        first_token_time=12.0,
        finished_time=14.0,
    )
    m = ts.scheduler_meta()
    assert m[P.QUEUE_TIME] == pytest.approx(0.5)
    assert m[P.PREFILL_FINISHED_TIME] - m[P.FORWARD_ENTRY_TIME] == pytest.approx(0.75)
    assert abs(m[P.FORWARD_ENTRY_TIME] - (time.time() - time.perf_counter() + 11.0)) < 1
    assert m[P.PREFILL_WAITING_LATENCY] == pytest.approx(0.5)
    assert m[P.PREFILL_LAUNCH_LATENCY] == pytest.approx(0.25)
    f = ts.finished_meta(completion_tokens=8)
    assert f[P.REQUEST_FINISHED_TS] - f[P.REQUEST_RECEIVED_TS] == pytest.approx(4.0)
    assert f[P.INFERENCE_TIME] == pytest.approx(3.0)
    assert f[P.DECODE_THROUGHPUT] == pytest.approx(3.5)  # SGLang's: 7 tokens after the first
    assert f[P.FIRST_TOKEN_LATENCY] == pytest.approx(2.0)
    # Nothing reached yet: no made-up points in time.
    empty = ReqTimeStats()
    assert P.FORWARD_ENTRY_TIME not in empty.scheduler_meta() and empty.finished_meta(0) == {}
    # The router copies them into the agent's trace, by the worker that reported them.
    assert worker_timing({**m, P.META_ID: "x"}, f) == {
        **{
            f"prefill.{k}": m[k]
            for k in (P.QUEUE_TIME, P.FORWARD_ENTRY_TIME, P.PREFILL_FINISHED_TIME)
        },
        **{
            f"decode.{k}": f[k]
            for k in (
                P.REQUEST_RECEIVED_TS,
                P.REQUEST_FINISHED_TS,
                P.FIRST_TOKEN_LATENCY,
                P.INFERENCE_TIME,
            )
        },
    }


def test_response_sent_to_client_ts_marks_the_first_chunk_as_sglang_does():
    from sglang_ext.engine.generate_io import ReplyBuilder
    from sglang_ext.engine.request import OutputChunk

    out = ReplyBuilder(make_req("r", [1, 2, 3], 2, Collector()), tokenizer=None)
    out.add(OutputChunk([7], [], [], 3, 1, 0))
    first = out.stream_chunk()[P.META_INFO]
    out.add(OutputChunk([8], [], [], 3, 2, 0, {"type": P.FINISH_LENGTH, "length": 2}))
    last = out.stream_chunk()[P.META_INFO]
    # The first chunk carries it; the last repeats the same stamp with the finished timings.
    assert first[P.RESPONSE_SENT_TO_CLIENT_TS] == last[P.RESPONSE_SENT_TO_CLIENT_TS]
    assert last[P.REQUEST_FINISHED_TS] >= last[P.RESPONSE_SENT_TO_CLIENT_TS]
    # A whole (non-streamed) reply is sent once it finished.
    whole = ReplyBuilder(make_req("w", [1, 2, 3], 1, Collector()), tokenizer=None)
    whole.add(OutputChunk([7], [], [], 3, 1, 0, {"type": P.FINISH_LENGTH, "length": 1}))
    m = whole.reply()[P.META_INFO]
    assert m[P.RESPONSE_SENT_TO_CLIENT_TS] >= m[P.REQUEST_FINISHED_TS]


def test_engine_stamps_a_request_in_order():
    eng = make_engine(chunk=4)
    col = Collector()
    req = make_req("r", list(range(1, 11)), 3, col)  # 3 chunks of prefill, then decode
    req.time_stats.created_time = ReqTimeStats.now()
    eng.submit(req)
    eng._drain(0)
    while not col.done.is_set():
        eng.step()
    t = req.time_stats
    order = [
        t.created_time,
        t.api_server_dispatch_finish_time,
        t.wait_queue_entry_time,
        t.forward_entry_time,
        t.prefill_run_batch_start_time,
        t.prefill_finished_time,
        t.completion_time,
    ]
    assert all(x > 0 for x in order) and order == sorted(order)


# --- real workers (the session's stack: a null worker, a PD pair behind sglang-router) ---------
def _ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 20000) for _ in range(n)]


def _post(url: str, body: dict) -> dict:
    r = requests.post(url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()[P.META_INFO]


def _in_order(meta: dict, *keys: str) -> None:
    values = [meta[k] for k in keys]
    assert values == sorted(values), dict(zip(keys, values))


@pytest.mark.slow
def test_null_and_pd_workers_report_sglang_timings(stack):
    body = {P.INPUT_IDS: _ids(1, 40), P.SAMPLING_PARAMS: {"max_new_tokens": 4, "temperature": 0}}
    m = _post(stack.null.url, body)
    assert set(P.WORKER_TIMING_KEYS) <= set(m)
    _in_order(
        m,
        P.REQUEST_RECEIVED_TS,
        P.FORWARD_ENTRY_TIME,
        P.PREFILL_FINISHED_TIME,
        P.REQUEST_FINISHED_TS,
    )
    assert 0 <= m[P.QUEUE_TIME] < m[P.REQUEST_FINISHED_TS] - m[P.REQUEST_RECEIVED_TS]
    # One PD request dispatched to both halves, as the shell router does for a successor.
    pd = {
        **body,
        P.INPUT_IDS: _ids(2, 40),
        P.BOOTSTRAP_HOST: "127.0.0.1",
        P.BOOTSTRAP_PORT: stack.prefill.bootstrap_port,
        P.BOOTSTRAP_ROOM: P.new_bootstrap_room(),
    }
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        pre, dec = ex.map(lambda url: _post(url, pd), (stack.prefill.url, stack.decode.url))
    _in_order(
        pre,
        P.REQUEST_RECEIVED_TS,
        P.FORWARD_ENTRY_TIME,
        P.PREFILL_FINISHED_TIME,
        P.REQUEST_FINISHED_TS,
    )
    # Decode starts on the transferred KV: its first forward comes after prefill's ended.
    _in_order(dec, P.REQUEST_RECEIVED_TS, P.FORWARD_ENTRY_TIME, P.REQUEST_FINISHED_TS)
    assert pre[P.PREFILL_FINISHED_TIME] <= dec[P.FORWARD_ENTRY_TIME]
    assert P.PREFILL_FINISHED_TIME not in dec  # as SGLang: decode runs no prefill


@pytest.mark.slow
async def test_the_pd_breakdown_of_real_requests_adds_up_to_their_ttft(stack):
    """A 3-1 question through the router on the real PD pair: every request (each dispatched
    to both workers by the router) has every part, each non-negative, summing to its TTFT."""
    from experiments.pd_breakdown import COMPONENTS, request_breakdown
    from experiments.results import AgentTrace
    from router.context import RouterContext
    from router.orchestrator import Session
    from tests.router_fixtures import stack_cluster, tree_config

    async with RouterContext.open(stack_cluster(stack)) as ctx:
        for mode in ("blocking", "pipelined"):
            session = Session(ctx, tree_config(max_new_tokens=4), "What is 7 times 8?", mode)
            result = await session.run_all()
            for agent_id, t in result.trace.items():
                a = AgentTrace.model_validate(t)
                parts = request_breakdown(a, session.clock.wall_t0)
                ttft = a.first_token_s - a.final_request_s
                known = {k: parts[k] for k in COMPONENTS if parts[k] is not None}
                where = (mode, agent_id, parts)
                assert all(v >= 0 for v in known.values()), where
                assert sum(known.values()) + parts["unattributed"] == pytest.approx(ttft, abs=1e-6)
                assert set(known) == set(COMPONENTS), where
                assert parts["unattributed"] == pytest.approx(0, abs=1e-3)
                assert parts["prefill_compute"] > 0
