"""Times one request's KV transfer over NIXL between two processes, through the engine's own
KVManager / KVSender / KVReceiver: this process is prefill, a spawned child is decode. Used by
benchmarks/bench_engine.py for goal (d)."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import torch

from sglang_ext.disagg import KVManager, KVPoll, KVReceiver, KVSender, page_ranges

POLL_S = 0.0005


def _decode_child(shape: tuple[int, ...], bootstrap_addr: str, conn) -> None:
    """Decode side: for each (room, tokens) received, preallocate and wait for the KV; answer
    (state, CLOCK_MONOTONIC at Success). The clock is system-wide, so the parent can compare."""
    os.environ["OMP_NUM_THREADS"] = "1"
    kv = torch.zeros(shape)
    mgr = KVManager("decode", kv, host="127.0.0.1", bootstrap_port=None, page_size=1)
    conn.send("up")
    while (msg := conn.recv()) is not None:
        room, tokens = msg
        rx = KVReceiver(mgr, bootstrap_addr, room)
        rx.init(page_ranges(kv, list(range(tokens)), 1))
        while not rx.poll().is_done:
            time.sleep(POLL_S)
        conn.send((int(rx.poll()), time.monotonic(), rx.failure_reason))
    mgr.close()
    os._exit(0)  # skip torch/UCX teardown: seconds on a loaded box


class KVTransferTimer:
    """`with KVTransferTimer(shape) as t: t.time(tokens)` -> seconds from send() to the KV and its
    notification being at decode. Pages are consecutive on both sides (a fresh pool's case), so
    the transfer is one range per layer and K/V; page size 1, as the engine's default."""

    def __init__(self, shape: tuple[int, ...], start_timeout_s: float = 180.0):
        self.shape, self.timeout = tuple(shape), start_timeout_s
        self.kv = torch.randn(self.shape)
        self.mgr: KVManager | None = None
        self._room = 1000
        self._proc = self._conn = None

    @property
    def bytes_per_token(self) -> int:
        n_layers, kv2, _, heads, dim = self.shape
        return n_layers * kv2 * heads * dim * self.kv.element_size()

    def __enter__(self) -> KVTransferTimer:  # noqa: PYI034 - final in practice
        self.mgr = KVManager("prefill", self.kv, host="127.0.0.1", bootstrap_port=None, page_size=1)
        addr = f"127.0.0.1:{self.mgr.bootstrap_port}"
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_decode_child, args=(self.shape, addr, child), daemon=True)
        self._proc.start()
        if not (self._conn.poll(self.timeout) and self._conn.recv() == "up"):
            self.__exit__()
            raise RuntimeError(f"the decode child did not start within {self.timeout:.0f} s")
        return self

    def time(self, tokens: int) -> float:
        """One transfer of `tokens` tokens of KV; raises RuntimeError when it fails."""
        self._room += 1
        sender = KVSender(self.mgr, f"127.0.0.1:{self.mgr.bootstrap_port}", self._room)
        self._conn.send((self._room, tokens))
        deadline = time.monotonic() + 60
        while sender.poll() == KVPoll.Bootstrapping and time.monotonic() < deadline:
            time.sleep(POLL_S)  # decode's destination (the handshake) is not timed
        if sender.poll() != KVPoll.WaitingForInput:
            raise RuntimeError(f"no destination from decode: {sender.failure_reason}")
        t0 = time.monotonic()
        sender.send(page_ranges(self.kv, list(range(tokens)), 1), {"first_token": 0})
        if not self._conn.poll(60):
            raise RuntimeError("decode saw no KV within 60 s")
        state, t_done, reason = self._conn.recv()
        if state != KVPoll.Success:
            raise RuntimeError(f"KV transfer failed at decode: {reason}")
        return t_done - t0

    def __exit__(self, *exc) -> None:
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            self._conn.send(None)
            self._proc.join(10)
            if self._proc.is_alive():
                self._proc.kill()
        if self.mgr is not None:
            self.mgr.close()
