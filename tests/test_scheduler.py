"""Scheduler + Engine loop with a fake model whose next token depends on every KV slot it reads,
and on their order: if pages or slots were mapped wrong (sharing, eviction, chunking, batching,
pages out of order), the output would differ from the pure-Python reference."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from sglang_ext.engine.config import EngineConfig
from sglang_ext.engine.engine import Engine
from sglang_ext.engine.request import OutputChunk, Req, SamplingParams

V = 97  # vocab; small ints are exact in float32


def next_token(seq) -> int:
    """31 * (position-weighted sum of the sequence) mod V: order-sensitive, unlike a plain sum."""
    return (31 * sum((i + 1) * t for i, t in enumerate(seq))) % V


class KVSumModel:
    """Writes each new token id as its K; next token = next_token(the sequence's K's, in slot
    order). All in int64 so that the sums stay exact."""

    def __init__(self, delay_s: float = 0.0):
        self.delay_s = delay_s  # makes requests live long enough to abort them

    def forward(self, batch, kv_buffer, all_logits=False):
        time.sleep(self.delay_s)
        kv_buffer[0, 0, batch.out_slots, 0, 0] = batch.input_ids.to(kv_buffer.dtype)
        rows = []
        for slots in batch.seq_slots:
            k = kv_buffer[0, 0, slots, 0, 0].long()
            s = int((k * torch.arange(1, len(k) + 1)).sum())
            rows.append(torch.nn.functional.one_hot(torch.tensor((31 * s) % V), V).float())
        return torch.stack(rows)


def reference(prompt: list[int], n: int) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(n):
        tok = next_token(seq)
        out.append(tok)
        seq.append(tok)
    return out


def make_engine(
    num_pages=64, page_size=4, chunk=64, max_running=8, delay_s=0.0, mode="null"
) -> Engine:
    cfg = EngineConfig(
        mode=mode,
        page_size=page_size,
        num_pages=num_pages,
        max_running_requests=max_running,
        max_queued_requests=100,
        max_prefill_tokens=chunk,
        chunked_prefill_size=chunk,
        context_length=512,
        vocab_size=V,
        eos_token_ids=frozenset(),
        random_seed=0,
        bootstrap_timeout_s=5,
        waiting_timeout_s=5,
    )
    kv = torch.zeros((1, 2, num_pages * page_size, 1, 1))
    return Engine(cfg, KVSumModel(delay_s), kv)


class Collector:
    def __init__(self):
        self.chunks: list[OutputChunk] = []
        self.done = threading.Event()

    def __call__(self, chunk: OutputChunk):
        self.chunks.append(chunk)
        if chunk.finished:
            self.done.set()

    @property
    def ids(self) -> list[int]:
        return [t for c in self.chunks for t in c.new_ids]

    @property
    def last(self) -> OutputChunk:
        return self.chunks[-1]


def make_req(rid, prompt, n, col, **sp) -> Req:
    sp.setdefault("temperature", 0.0)
    return Req(
        rid=rid,
        input_ids=list(prompt),
        on_output=col,
        sampling=SamplingParams(max_new_tokens=n, **sp),
    )


def submit(engine, rid, prompt, n, **sp) -> Collector:
    col = Collector()
    engine.submit(make_req(rid, prompt, n, col, **sp))
    return col


def settle(engine) -> dict:
    engine.call(engine.check_integrity).result(5)
    return engine.call(engine.stats).result(5)


@pytest.fixture
def engine():
    eng = make_engine(delay_s=0.002)
    eng.start()
    yield eng
    eng.shutdown()


def test_single_request_matches_reference(engine):
    col = submit(engine, "a", [5, 6, 7], 10)
    assert col.done.wait(5)
    assert col.ids == reference([5, 6, 7], 10)
    assert col.last.finish_reason == {"type": "length", "length": 10}
    s = settle(engine)
    assert s["in_use_pages"] == 0 and s["reserved_pages"] == 0


def test_prefix_reuse_reports_cached_tokens_and_stays_correct(engine):
    prompt = list(range(1, 22))
    first = submit(engine, "a", prompt, 4)
    assert first.done.wait(5)
    # The first request cached prompt + its first 3 outputs (24 tokens with KV, 6 pages of 4).
    follow_up = prompt + first.ids[:3] + [1, 2]
    second = submit(engine, "b", follow_up, 4)
    assert second.done.wait(5)
    assert second.ids == reference(follow_up, 4)
    assert second.last.cached_tokens == 24
    other = submit(engine, "c", prompt + [50, 50], 2)  # diverges inside page 6: 5 pages match
    assert other.done.wait(5) and other.last.cached_tokens == 20
    settle(engine)


def test_concurrent_requests_beyond_pool_wait_and_finish():
    eng = make_engine(num_pages=12, page_size=4, max_running=4)  # 48 tokens of KV
    eng.start()
    try:
        prompts = [[i + 1] * (5 + i) for i in range(10)]
        cols = [submit(eng, f"r{i}", p, 12) for i, p in enumerate(prompts)]
        for i, (c, p) in enumerate(zip(cols, prompts)):
            assert c.done.wait(10), f"request {i} never finished"
            assert c.ids == reference(p, 12), f"request {i} wrong"
        s = settle(eng)
        assert s["in_use_pages"] == 0 and s["free_pages"] + s["cached_pages"] == 12
    finally:
        eng.shutdown()


def test_chunked_prefill_is_exact():
    eng = make_engine(chunk=8)
    eng.start()
    try:
        prompt = [(7 * i) % 50 + 1 for i in range(45)]
        col = submit(eng, "long", prompt, 5)
        assert col.done.wait(5)
        assert col.ids == reference(prompt, 5)
        settle(eng)
    finally:
        eng.shutdown()


def test_abort_frees_pages(engine):
    col = submit(engine, "slow", [1, 2, 3], 200)
    while not col.chunks:
        col.done.wait(0.01)
    assert engine.abort("slow").result(5) is True
    assert col.done.wait(5) and col.last.finish_reason["type"] == "abort"
    assert engine.abort("slow").result(5) is False  # unknown now
    s = settle(engine)
    assert s["in_use_pages"] == 0 and s["num_live_reqs"] == 0 and s["reserved_pages"] == 0


def test_too_big_for_pool_is_503():
    eng = make_engine(num_pages=4, page_size=4)
    eng.start()
    try:
        col = submit(eng, "big", [1] * 10, 20)
        assert col.done.wait(5)
        assert col.last.status == 503 and "max-total-tokens" in col.last.finish_reason["message"]
    finally:
        eng.shutdown()


def test_stop_token_ids_and_min_new_tokens(engine):
    prompt = [9, 9]
    ref = reference(prompt, 12)
    stop = ref[2]
    col = submit(engine, "s", prompt, 12, stop_token_ids=[stop])
    assert col.done.wait(5)
    assert col.ids == ref[: ref.index(stop) + 1]
    assert col.last.finish_reason == {"type": "stop", "matched": stop}
    # min_new_tokens 5: the stop token at output 3 is ignored; the one at output 7 stops it
    assert stop not in ref[3:7]
    col = submit(engine, "m", prompt, 12, stop_token_ids=[stop, ref[6]], min_new_tokens=5)
    assert col.done.wait(5)
    assert col.ids == ref[:7]
    assert col.last.finish_reason == {"type": "stop", "matched": ref[6]}


def test_eviction_under_pressure_keeps_outputs_right():
    eng = make_engine(num_pages=10, page_size=2, max_running=2)
    eng.start()
    try:
        for i in range(12):  # each leaves ~5 pages cached; the pool forces evictions
            p = [i % 5 + 1, i % 3 + 1] * 4
            col = submit(eng, f"e{i}", p, 3)
            assert col.done.wait(5)
            assert col.ids == reference(p, 3)
            settle(eng)
    finally:
        eng.shutdown()


def test_duplicate_rid_is_rejected(engine):
    a = submit(engine, "dup", [1, 2], 200)
    b = submit(engine, "dup", [1, 2], 3)
    assert b.done.wait(5) and b.last.status == 400
    engine.abort("dup").result(5)
    assert a.done.wait(5)
