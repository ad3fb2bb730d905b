"""A real PD transfer between two processes over NIXL: this process is prefill, a spawned child
is decode. Several rooms at once, shuffled destination pages, aux round trip, bytes checked."""

import multiprocessing as mp
import os
import time

import pytest
import torch

from sglang_ext.disagg import KVManager, KVPoll, KVReceiver, KVSender, page_ranges

SHAPE, PS = (3, 2, 64, 2, 8), 4  # 16 pages
# room -> (prefill pages, decode pages), in token order on both sides
PLAN = {
    11: ([1, 2, 3], [9, 4, 5]),
    12: ([7], [0]),
    13: ([10, 11, 12, 13], [15, 14, 13, 12]),
}


def prefill_kv() -> torch.Tensor:
    return torch.arange(torch.Size(SHAPE).numel(), dtype=torch.float32).reshape(SHAPE)


def decode_child(bootstrap_addr: str, conn) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    kv = torch.zeros(SHAPE)
    mgr = KVManager(
        "decode", kv, host="127.0.0.1", bootstrap_port=None, page_size=PS, waiting_timeout=20
    )
    conn.send("up")
    conn.recv()  # the parent's first sender exists: show up now
    receivers = {room: KVReceiver(mgr, bootstrap_addr, room) for room in PLAN}
    for room, (_, dst_pages) in PLAN.items():
        receivers[room].init(page_ranges(kv, dst_pages, PS))
    deadline = time.monotonic() + 25
    while not all(r.poll().is_done for r in receivers.values()) and time.monotonic() < deadline:
        time.sleep(0.002)
    conn.send(
        {
            room: (int(r.poll()), r.aux() if r.poll() == KVPoll.Success else r.failure_reason)
            for room, r in receivers.items()
        }
    )
    conn.send(kv.numpy().copy())
    mgr.close()
    os._exit(0)  # skip interpreter teardown (torch, UCX): seconds on a loaded 2-core box


@pytest.mark.slow
def test_two_process_transfer():
    kv = prefill_kv()
    mgr = KVManager(
        "prefill",
        kv,
        host="127.0.0.1",
        bootstrap_port=None,
        page_size=PS,
        bootstrap_timeout=25,
        waiting_timeout=20,
    )
    try:
        addr = f"127.0.0.1:{mgr.bootstrap_port}"
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=decode_child, args=(addr, child), daemon=True)
        proc.start()
        # Spawning imports torch afresh: slow on a loaded box, so start the clocks after it.
        assert parent.poll(90) and parent.recv() == "up", "decode child did not start"
        senders = {11: KVSender(mgr, addr, 11)}  # exists before decode shows up
        parent.send("go")
        senders |= {room: KVSender(mgr, addr, room) for room in (12, 13)}
        # Room 13 is sent before its destination arrives; the others once it has.
        aux = {
            room: {
                "output_id": room,
                "logprob": -0.5,
                "cached_tokens": room % 3,
                "prompt_tokens": 4 * len(PLAN[room][0]),
                "top_logprobs": [[-0.5, room]],
            }
            for room in PLAN
        }
        senders[13].send(page_ranges(kv, PLAN[13][0], PS), aux[13])
        deadline = time.monotonic() + 30
        pending = {11, 12}
        while not all(s.poll().is_done for s in senders.values()):
            assert time.monotonic() < deadline, {r: s.poll() for r, s in senders.items()}
            for room in [r for r in pending if senders[r].poll() == KVPoll.WaitingForInput]:
                senders[room].send(page_ranges(kv, PLAN[room][0], PS), aux[room])
                pending.discard(room)
            time.sleep(0.002)
        assert {r: s.poll() for r, s in senders.items()} == dict.fromkeys(PLAN, KVPoll.Success)
        assert parent.poll(30), "decode child sent nothing"
        results = parent.recv()
        dkv = torch.from_numpy(parent.recv())
        proc.join(10)
    finally:
        mgr.close()
    assert results == {room: (int(KVPoll.Success), aux[room]) for room in PLAN}
    used = set()
    for src_pages, dst_pages in PLAN.values():
        for sp, dp in zip(src_pages, dst_pages):
            assert torch.equal(
                dkv[:, :, dp * PS : (dp + 1) * PS], kv[:, :, sp * PS : (sp + 1) * PS]
            )
            used.add(dp)
    for dp in set(range(16)) - used:
        assert torch.count_nonzero(dkv[:, :, dp * PS : (dp + 1) * PS]) == 0
