"""KVSender / KVReceiver over real NIXL, both managers in this process: transfer, aux, aborts,
timeouts and unreachable peers. Short timeouts keep the failure cases fast."""

import itertools
import socket
import time

import aiohttp
import pytest
import torch

from sglang_ext.disagg import KVManager, KVPoll, KVReceiver, KVSender, page_ranges

SHAPE, PS = (2, 2, 32, 2, 4), 4  # 8 pages
TIMEOUT = 1.5
rooms = itertools.count(1000)


@pytest.fixture(scope="module")
def pair():
    pkv = torch.arange(torch.Size(SHAPE).numel(), dtype=torch.float32).reshape(SHAPE)
    dkv = torch.zeros(SHAPE)
    kw = {
        "host": "127.0.0.1",
        "page_size": PS,
        "bootstrap_timeout": TIMEOUT,
        "waiting_timeout": TIMEOUT,
    }
    prefill = KVManager("prefill", pkv, bootstrap_port=None, **kw)
    decode = KVManager("decode", dkv, bootstrap_port=None, **kw)
    yield prefill, decode, f"127.0.0.1:{prefill.bootstrap_port}"
    prefill.close()
    decode.close()


def wait(obj, states, timeout=5.0):
    deadline = time.monotonic() + timeout
    while (state := obj.poll()) not in states:
        assert time.monotonic() < deadline, f"room {obj.room} stuck in {state!r}"
        time.sleep(0.002)
    return state


def handshake(pair, src_pages, dst_pages):
    prefill, decode, addr = pair
    room = next(rooms)
    sender = KVSender(prefill, addr, room)
    receiver = KVReceiver(decode, addr, room)
    receiver.init(page_ranges(decode.kv_buffer, dst_pages, PS))
    assert wait(sender, {KVPoll.WaitingForInput}) == KVPoll.WaitingForInput
    assert wait(receiver, {KVPoll.WaitingForInput}) == KVPoll.WaitingForInput
    return sender, receiver, page_ranges(prefill.kv_buffer, src_pages, PS)


def test_transfer_moves_pages_and_aux(pair):
    prefill, decode, _ = pair
    sender, receiver, src = handshake(pair, [1, 2], [6, 3])
    aux = {
        "output_id": 5,
        "logprob": -0.25,
        "top_logprobs": [[-0.25, 5], [-1.5, 9]],
        "cached_tokens": 4,
        "prompt_tokens": 7,
    }
    sender.send(src, aux)
    assert wait(sender, {KVPoll.Success, KVPoll.Failed}) == KVPoll.Success
    assert wait(receiver, {KVPoll.Success, KVPoll.Failed}) == KVPoll.Success
    assert receiver.aux() == aux
    p, d = prefill.kv_buffer, decode.kv_buffer
    assert torch.equal(d[:, :, 24:28], p[:, :, 4:8]) and torch.equal(d[:, :, 12:16], p[:, :, 8:12])


def test_send_before_destination_waits_for_it(pair):
    prefill, decode, addr = pair
    room = next(rooms)
    sender = KVSender(prefill, addr, room)
    sender.send(page_ranges(prefill.kv_buffer, [7], PS), {"output_id": 1})
    assert sender.poll() == KVPoll.Bootstrapping
    receiver = KVReceiver(decode, addr, room)  # decode shows up later
    receiver.init(page_ranges(decode.kv_buffer, [0], PS))
    assert wait(receiver, {KVPoll.Success, KVPoll.Failed}) == KVPoll.Success
    assert wait(sender, {KVPoll.Success, KVPoll.Failed}) == KVPoll.Success
    assert torch.equal(decode.kv_buffer[:, :, 0:4], prefill.kv_buffer[:, :, 28:32])


def test_unreachable_bootstrap_fails_with_url_and_room(pair):
    _, decode, _ = pair
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: refused
    receiver = KVReceiver(decode, dead, 77)
    receiver.init(page_ranges(decode.kv_buffer, [0], PS))
    assert wait(receiver, {KVPoll.Failed, KVPoll.Success}, timeout=3) == KVPoll.Failed
    assert (
        f"http://{dead}/route" in receiver.failure_reason and "room 77" in receiver.failure_reason
    )


def test_sender_without_decode_times_out(pair):
    prefill, _, addr = pair
    sender = KVSender(prefill, addr, next(rooms))
    assert sender.poll() == KVPoll.Bootstrapping
    assert wait(sender, {KVPoll.Failed}, timeout=TIMEOUT + 2) == KVPoll.Failed
    assert (
        f"room {sender.room}" in sender.failure_reason
        and "bootstrap timeout" in sender.failure_reason
    )


def test_receiver_abort_fails_the_sender(pair):
    sender, receiver, _ = handshake(pair, [0], [0])
    receiver.abort()
    assert receiver.poll() == KVPoll.Failed and "aborted by decode" in receiver.failure_reason
    assert wait(sender, {KVPoll.Failed}, timeout=2) == KVPoll.Failed
    assert "decode aborted" in sender.failure_reason


def test_sender_abort_fails_the_receiver_at_once(pair):
    sender, receiver, _ = handshake(pair, [0], [0])
    sender.abort()
    assert sender.poll() == KVPoll.Failed
    assert wait(receiver, {KVPoll.Failed}, timeout=1) == KVPoll.Failed  # well before its timeout
    assert "aborted by prefill" in receiver.failure_reason


def test_destination_for_aborted_room_is_refused(pair):
    prefill, decode, addr = pair
    room = next(rooms)
    KVSender(prefill, addr, room).abort()
    receiver = KVReceiver(decode, addr, room)
    receiver.init(page_ranges(decode.kv_buffer, [1], PS))
    assert wait(receiver, {KVPoll.Failed}, timeout=2) == KVPoll.Failed
    assert "aborted on prefill" in receiver.failure_reason


def test_decode_abort_before_prefill_takes_the_room(pair):
    prefill, decode, addr = pair
    room = next(rooms)
    receiver = KVReceiver(decode, addr, room)
    receiver.init(page_ranges(decode.kv_buffer, [1], PS))
    wait(receiver, {KVPoll.WaitingForInput})
    receiver.abort()
    deadline = time.monotonic() + 2
    while room not in prefill._tombstones and time.monotonic() < deadline:
        time.sleep(0.005)
    sender = KVSender(prefill, addr, room)
    assert sender.poll() == KVPoll.Failed and "decode aborted" in sender.failure_reason


def test_page_count_mismatch_fails_both_sides(pair):
    sender, receiver, src = handshake(pair, [0, 1], [2])
    sender.send(src, {})
    assert wait(sender, {KVPoll.Failed, KVPoll.Success}) == KVPoll.Failed
    assert "same number of pages" in sender.failure_reason
    assert wait(receiver, {KVPoll.Failed, KVPoll.Success}) == KVPoll.Failed
    assert "prefill failed room" in receiver.failure_reason


def test_receiver_without_kv_times_out(pair):
    sender, receiver, _ = handshake(pair, [0], [0])
    assert wait(receiver, {KVPoll.Failed}, timeout=TIMEOUT + 2) == KVPoll.Failed
    assert "waiting timeout" in receiver.failure_reason
    sender.abort()


def test_bad_use_raises(pair):
    prefill, decode, addr = pair
    room = next(rooms)
    KVSender(prefill, addr, room)
    with pytest.raises(ValueError, match="already has a live KVSender"):
        KVSender(prefill, addr, room)
    with pytest.raises(ValueError, match="decode KVManager"):
        KVReceiver(prefill, addr, room)
    with pytest.raises(ValueError, match="host:port"):
        KVReceiver(decode, "no-port", room)
    with pytest.raises(ValueError, match="outside"):
        KVReceiver(decode, addr, room).init(page_ranges(prefill.kv_buffer, [0], PS))
    with pytest.raises(ValueError, match="under"):  # the aux rides in one NIXL notification
        KVSender(prefill, addr, next(rooms)).send(
            page_ranges(prefill.kv_buffer, [0], PS), {"top": "x" * (1 << 20)}
        )
    with pytest.raises(ValueError, match="mode"):
        KVManager("both", decode.kv_buffer, host="127.0.0.1", bootstrap_port=None, page_size=PS)


async def test_prefill_registers_with_its_bootstrap_server(pair):
    prefill, _, addr = pair
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://{addr}/route?engine_rank=0&target_dp_group=0") as r,
    ):
        route = await r.json()
    assert (route["rank_ip"], route["rank_port"]) == ("127.0.0.1", prefill.control.port)
    assert route["agent_name"] == prefill.backend.name


def test_closed_manager_refuses_new_rooms():
    kv = torch.zeros(SHAPE)
    mgr = KVManager("decode", kv, host="127.0.0.1", bootstrap_port=None, page_size=PS)
    mgr.close()
    mgr.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        KVReceiver(mgr, "127.0.0.1:1", 1)
