"""PD queues in one process: a prefill and a decode Engine (the order-sensitive KVSumModel of
test_scheduler) joined by in-memory transfer doubles that copy the real KV bytes. Covers the
request lifecycle across both workers, aborts in every queue, failing transfers, the decode
quarantine and the engine loop's idling. The engines are stepped by hand (no thread) except where
the loop itself is under test."""

from __future__ import annotations

import ctypes
import time

import pytest
from test_scheduler import Collector, make_engine, make_req, reference

from sglang_ext import protocol as P
from sglang_ext.disagg import KVPoll, match_ranges
from sglang_ext.disagg.ranges import page_runs
from sglang_ext.engine.request import Req, SamplingParams


class Sender:
    """KVSender double: the test moves its state; send() keeps what would travel."""

    def __init__(self, req):
        self.room = req.bootstrap_room
        self.state = KVPoll.WaitingForInput
        self.sent = None  # (src ranges, aux)
        self.aborted = False
        self.failure_reason = None
        self.timed_out = False
        self.poll_error: Exception | None = None

    def poll(self):
        if self.poll_error is not None:
            raise self.poll_error
        return self.state

    def send(self, ranges, aux):
        self.sent = (ranges, aux)
        self.state = KVPoll.Transferring

    def abort(self):
        self.aborted = True
        if self.state != KVPoll.Success:
            self.state = KVPoll.Failed


class Receiver:
    """KVReceiver double: `deliver` copies the sender's bytes into the destination pages."""

    def __init__(self, req):
        self.room = req.bootstrap_room
        self.state = KVPoll.Bootstrapping
        self.dst = None
        self.aux_data = None
        self.aborted = False
        self.failure_reason = None
        self.timed_out = False
        self.prefill_may_write = False  # what KVReceiver tracks: destination out, no abort ack

    @property
    def writes_possible(self) -> bool:
        return self.prefill_may_write and self.state != KVPoll.Success

    def init(self, ranges):
        self.dst = ranges
        self.state = KVPoll.WaitingForInput
        self.prefill_may_write = True

    def poll(self):
        return self.state

    def aux(self):
        return self.aux_data

    def abort(self):
        self.aborted = True
        if self.state != KVPoll.Success:
            self.state = KVPoll.Failed

    def deliver(self, sender: Sender) -> None:
        src, dst = match_ranges(sender.sent[0], self.dst)
        for (s, n), (d, _) in zip(src, dst):
            ctypes.memmove(d, s, n)
        self.aux_data = sender.sent[1]
        self.state = sender.state = KVPoll.Success


def pd_engine(mode: str, **kw):
    eng = make_engine(mode=mode, **kw)
    peers = {}

    def new(cls):
        def make(req):
            peers[req.rid] = cls(req)
            return peers[req.rid]

        return make

    eng.sched.kv_transfer.make_sender = new(Sender)
    eng.sched.kv_transfer.make_receiver = new(Receiver)
    return eng, peers


def pd_req(rid, prompt, n, col, room, **sp):
    req = make_req(rid, prompt, n, col, **sp)
    req.bootstrap_host, req.bootstrap_room = "127.0.0.1", room
    return req


def run(engine, steps: int = 1) -> None:
    """What the engine thread does, in the test's thread: run queued commands, then step."""
    for _ in range(steps):
        engine._drain(0)
        engine.step()
    engine._drain(0)


def stats(engine) -> dict:
    engine.check_integrity()
    return engine.stats()


def through_pd(prefill, pp, decode, dp, rid, prompt, n, **sp) -> Collector:
    """One request through both engines (prefill makes token 1, decode the rest)."""
    pcol, dcol = Collector(), Collector()
    room = hash(rid) % 2**31
    prefill.submit(pd_req(rid, prompt, n, pcol, room, **sp))
    decode.submit(pd_req(rid, prompt, n, dcol, room, **sp))
    run(decode)  # admitted: destination pages chosen, receiver.init
    run(prefill)  # prefill computed, send() started
    dp[rid].deliver(pp[rid])
    run(prefill)
    assert pcol.done.is_set() and pcol.last.status == 200 and len(pcol.ids) == 1
    run(decode, n + 1)
    assert dcol.done.is_set(), dcol.chunks
    return dcol


def test_pd_output_equals_null_greedy_and_seeded_across_scattered_pages():
    prefill, pp = pd_engine("prefill")
    decode, dp = pd_engine("decode")
    # Scatter decode's free list so its pages are neither prefill's nor adjacent ones.
    held = decode.sched.pool.alloc(20)
    decode.sched.pool.free(held[1::2])
    null = make_engine()
    null.start()
    try:
        prompt = [(5 * i) % 90 + 1 for i in range(23)]
        got = through_pd(prefill, pp, decode, dp, "g", prompt, 9)
        assert got.ids == reference(prompt, 9)
        seeded = {"temperature": 1.0, "sampling_seed": 42}
        col = Collector()
        null.submit(make_req("s", prompt, 9, col, **seeded))
        assert col.done.wait(5)
        got = through_pd(prefill, pp, decode, dp, "s", prompt, 9, **seeded)
        assert got.ids == col.ids  # token 2 onwards drawn on decode as they are on null
    finally:
        null.shutdown()
    decode.sched.pool.free(held[::2])
    for eng in (prefill, decode):
        s = stats(eng)
        assert s["num_live_reqs"] == 0 and s["in_use_pages"] == 0 and s["reserved_pages"] == 0


def test_prefill_request_stays_live_while_its_kv_is_sent():
    prefill, pp = pd_engine("prefill")
    col = Collector()
    prefill.submit(pd_req("a", list(range(1, 14)), 1, col, room=7))
    run(prefill)
    assert pp["a"].state == KVPoll.Transferring and not col.chunks
    assert "a" in prefill.reqs  # finished (one token) but its pages are still being sent
    s = stats(prefill)  # no false leak report
    assert s["in_use_pages"] > 0 and s["pd_inflight"] == 1
    assert prefill.flush_cache() is False  # the tree must stay while pages are in flight
    fut = prefill.abort("a")
    run(prefill)
    assert fut.result(1) is True and pp["a"].aborted
    assert col.last.finish_reason["type"] == P.FINISH_ABORT
    s = stats(prefill)
    assert s["num_live_reqs"] == 0 and s["in_use_pages"] == 0
    assert prefill.flush_cache() is True


def test_a_failed_send_is_reported_as_a_failure():
    prefill, pp = pd_engine("prefill")
    col = Collector()
    prefill.submit(pd_req("a", [3, 4, 5, 6, 7], 1, col, room=8))
    run(prefill)
    pp["a"].state, pp["a"].failure_reason = KVPoll.Failed, "decode went away"
    run(prefill)
    assert col.last.status == 502 and "decode went away" in col.last.finish_reason["message"]
    assert stats(prefill)["in_use_pages"] == 0


@pytest.mark.parametrize("where", ["waiting", "prefilling"])
def test_abort_in_a_scheduler_queue_aborts_the_transfer(where):
    prefill, pp = pd_engine("prefill", chunk=8, max_running=1)
    cols = [Collector(), Collector()]
    for i, col in enumerate(cols):  # 40-token prompts: five 8-token chunks each
        prefill.submit(pd_req(f"r{i}", [i + 1] * 40, 1, col, room=20 + i))
    run(prefill)
    victim = "r1" if where == "waiting" else "r0"
    queue = prefill.sched.waiting if where == "waiting" else prefill.sched.prefilling
    assert prefill.reqs[victim] in queue
    fut = prefill.abort(victim)
    run(prefill)
    assert fut.result(1) is True and pp[victim].aborted  # decode hears of it, not a timeout
    stats(prefill)
    run(prefill, 6)
    other = "r0" if victim == "r1" else "r1"
    assert pp[other].state == KVPoll.Transferring
    assert stats(prefill)["num_live_reqs"] == 1


def test_one_broken_transfer_fails_alone():
    prefill, pp = pd_engine("prefill")
    pcols = {rid: Collector() for rid in ("ok", "bad")}
    for i, (rid, col) in enumerate(pcols.items()):
        prefill.submit(pd_req(rid, [i + 2] * 9, 1, col, room=30 + i))
    run(prefill)
    pp["bad"].poll_error = RuntimeError("transport exploded")
    pp["ok"].state = KVPoll.Success
    run(prefill)
    assert pcols["ok"].last.status == 200
    assert (
        pcols["bad"].last.status == 502 and "exploded" in pcols["bad"].last.finish_reason["message"]
    )
    # decode: aux without the first token fails that request only
    decode, dp = pd_engine("decode")
    dcols = {rid: Collector() for rid in ("ok", "bad")}
    for i, (rid, col) in enumerate(dcols.items()):
        decode.submit(pd_req(rid, [i + 2] * 9, 3, col, room=30 + i))
    run(decode)
    for rid in dcols:
        dp[rid].state = KVPoll.Success
    dp["ok"].aux_data = {P.AUX_FIRST_TOKEN: 5, P.CACHED_TOKENS: 0}
    dp["bad"].aux_data = {P.CACHED_TOKENS: 0}
    run(decode, 4)
    assert dcols["ok"].last.status == 200 and len(dcols["ok"].ids) == 3
    assert dcols["bad"].last.status == 502 and "aux" in dcols["bad"].last.finish_reason["message"]
    for eng in (prefill, decode):
        assert stats(eng)["in_use_pages"] == 0 and stats(eng)["num_live_reqs"] == 0


def test_decode_pages_stay_in_runs_after_interleaved_streams():
    """A decode worker's streams take their pages at admission, so those that decode side by
    side do not interleave theirs, and a later prompt's KV destination is a few runs of
    consecutive pages (each run one range per layer and K/V), not one range per page."""
    decode, dp = pd_engine("decode", num_pages=256, page_size=1)
    cols = {f"s{i}": Collector() for i in range(3)}
    for i, (rid, col) in enumerate(cols.items()):
        decode.submit(pd_req(rid, [i + 1] * 8, 24, col, room=50 + i))
    run(decode)
    for rid in cols:
        dp[rid].state, dp[rid].aux_data = KVPoll.Success, {P.AUX_FIRST_TOKEN: 5}
    run(decode, 30)  # all three decode in one batch, step by step, to the end
    assert all(c.done.is_set() for c in cols.values())
    decode.submit(pd_req("next", [7] * 90, 2, Collector(), room=60))
    run(decode)
    runs = page_runs(decode.reqs["next"].pages[:90])
    assert len(runs) <= 3, runs  # the three freed blocks at most; 90 runs if interleaved


def test_decode_keeps_given_up_pages_until_prefill_lets_go():
    decode, dp = pd_engine("decode")
    col = Collector()
    decode.submit(pd_req("a", [1] * 10, 4, col, room=40))
    run(decode)
    free_before = decode.sched.pool.num_free
    decode.abort("a")
    run(decode)
    assert dp["a"].aborted and col.last.finish_reason["type"] == P.FINISH_ABORT
    s = stats(decode)  # integrity counts the quarantined pages
    # Admitted with its whole reservation (10 + 4 tokens: 4 pages): the prompt's 3 pages, which
    # prefill may still write, stay out of the pool; the page for decoding came back at once.
    assert s["pd_quarantined_pages"] == 3 and decode.sched.pool.num_free == free_before + 1
    dp["a"].prefill_may_write = False  # prefill acknowledged the abort
    run(decode)
    s = stats(decode)
    assert s["pd_quarantined_pages"] == 0 and s["free_pages"] == s["total_pages"]


def test_loop_waits_instead_of_spinning_when_nothing_can_be_scheduled():
    # Request a holds 4 of 5 pages while its KV is sent; b needs 3 and must wait for them.
    prefill, pp = pd_engine("prefill", num_pages=5)
    steps = 0
    step = prefill.step

    def counting_step():
        nonlocal steps
        steps += 1
        return step()

    prefill.step = counting_step
    prefill.start()
    try:
        cols = [Collector(), Collector()]
        prefill.submit(pd_req("a", [1] * 16, 1, cols[0], room=50))
        deadline = time.monotonic() + 5
        while "a" not in pp or pp["a"].state != KVPoll.Transferring:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        prefill.submit(pd_req("b", [2] * 12, 1, cols[1], room=51))
        time.sleep(0.05)
        steps = 0
        time.sleep(0.4)
        assert steps < 400, f"{steps} steps in 0.4 s: the loop spins"  # 2 ms polls: ~200
        pp["a"].state = KVPoll.Success
        deadline = time.monotonic() + 5
        while not (cols[0].done.is_set() and "b" in pp and pp["b"].sent):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        prefill.shutdown()


def test_seeded_sampling_does_not_depend_on_the_batch():
    # The null engine draws with a generator per (seed, position): same ids alone or batched.
    def run_one(extra: int) -> list[int]:
        eng = make_engine()
        cols = [Collector() for _ in range(extra + 1)]
        eng.submit(make_req("s", [4, 5, 6], 6, cols[0], temperature=1.0, sampling_seed=3))
        for i in range(extra):
            eng.submit(make_req(f"o{i}", [7, i], 6, cols[i + 1], temperature=1.0))
        run(eng, 8)
        return cols[0].ids

    assert run_one(0) == run_one(3)


def test_req_fail_overrides_a_finish_not_yet_delivered():
    req = Req(rid="x", input_ids=[1], sampling=SamplingParams())
    req.finish({"type": P.FINISH_LENGTH, "length": 1})
    req.fail("KV send failed", 502)
    assert req.status == 502 and req.finish_reason["type"] == P.FINISH_ABORT


def test_each_worker_moves_a_request_through_its_states():
    """All transitions go through the scheduler's one `_move`, in the documented order, and the
    table and queues agree after every step."""
    from sglang_ext.engine.request import ReqState as S

    prefill, pp = pd_engine("prefill", chunk=8)
    decode, dp = pd_engine("decode")
    moves = {"prefill": [], "decode": []}
    for name, eng in (("prefill", prefill), ("decode", decode)):

        def record(req, state, _move=eng.sched._move, name=name):
            moves[name].append(state)
            _move(req, state)

        eng.sched._move = record
    pcol, dcol = Collector(), Collector()
    prompt = list(range(1, 21))  # three 8-token chunks on prefill
    prefill.submit(pd_req("s", prompt, 3, pcol, room=60))
    decode.submit(pd_req("s", prompt, 3, dcol, room=60))
    for _ in range(4):
        run(decode)
        run(prefill)
        stats(prefill), stats(decode)
    dp["s"].deliver(pp["s"])
    for _ in range(4):
        run(prefill)
        run(decode)
        stats(prefill), stats(decode)
    assert pcol.last.status == 200 and dcol.done.is_set() and len(dcol.ids) == 3
    assert moves["prefill"] == [S.BOOTSTRAP, S.WAITING, S.PREFILLING, S.SENDING, S.DONE]
    assert moves["decode"] == [S.PREALLOC, S.RECEIVING, S.RUNNING, S.DONE]
    assert not prefill.reqs and not decode.reqs


@pytest.mark.parametrize("priority_scheduling", [True, False])
def test_decode_admits_by_priority_then_arrival(priority_scheduling):
    """With its one running slot taken, a decode worker queues new requests in prealloc; the slot
    goes to the highest priority first (SGLang's DecodePreallocQueue: a stable sort by priority),
    or in arrival order without priority scheduling."""
    from dataclasses import replace

    decode, dp = pd_engine("decode", max_running=1)
    decode.cfg = decode.sched.cfg = replace(
        decode.cfg, enable_priority_scheduling=priority_scheduling
    )
    prompt = [3, 1, 4, 1, 5]
    for i, (rid, prio) in enumerate((("busy", 0), ("low", 0), ("low2", 0), ("high", 7))):
        req = pd_req(rid, prompt, 4, Collector(), room=80 + i)
        req.priority = prio
        decode.submit(req)
        run(decode)
    admitted = [rid for rid in ("busy", "low", "low2", "high") if dp[rid].dst is not None]
    assert admitted == ["busy"]  # one slot: the rest wait in prealloc
    order = []
    for _ in range(3):
        decode.abort(order[-1] if order else "busy")  # frees the slot
        run(decode)
        order.append(next(r for r in ("low", "low2", "high") if r not in order and dp[r].dst))
    assert order == (["high", "low", "low2"] if priority_scheduling else ["low", "low2", "high"])
