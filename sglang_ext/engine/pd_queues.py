"""PD queues around the scheduler, as SGLang names them: prefill bootstrap + inflight, decode
prealloc + transfer. Called from the engine thread each step (`poll`) and on add/abort.

Prefill: wait for decode's destination (WaitingForInput) → admit and prefill → send the prompt's
pages + aux (first token, logprobs, cached_tokens) → on Success cache the prompt and reply.
Decode: admit when pages fit → KVReceiver.init(dst pages) → on Success take the first token from
aux and decode on as a normal running request. Timeouts live in the KVSender/KVReceiver (their
KVManager has the engine's bootstrap and waiting timeouts).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sglang_ext import protocol as P
from sglang_ext.disagg import FakeKVSender, KVPoll, KVReceiver, KVSender, page_ranges
from sglang_ext.engine.request import Req
from sglang_ext.engine.scheduler import Scheduler

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Quarantined:
    """Decode pages of a request given up while prefill might still WRITE into them."""

    pages: list[int]
    receiver: Any
    until: float  # released at this time even if prefill never acknowledges the abort


class PDQueues:
    def __init__(self, sched: Scheduler, kv_manager, kv_buffer) -> None:
        self.sched, self.cfg = sched, sched.cfg
        self.mgr, self.kv_buffer = kv_manager, kv_buffer
        self.bootstrap: list[Req] = []  # prefill: waiting for decode's destination
        self.inflight: list[Req] = []  # prefill: KV being sent
        self.prealloc: list[Req] = []  # decode: waiting for pages
        self.transfer: list[Req] = []  # decode: KV being received
        self.quarantine: list[Quarantined] = []  # decode: pages a late WRITE may still hit
        # How a request gets its transfer endpoint; tests swap in doubles (fake_transfer.py).
        self.make_sender: Callable[[Req], Any] = self._new_sender
        self.make_receiver: Callable[[Req], Any] = self._new_receiver
        if self.cfg.mode == "prefill":
            sched.on_prefill_done = self._send

    def __len__(self) -> int:
        return len(self.bootstrap) + len(self.inflight) + len(self.prealloc) + len(self.transfer)

    def counts(self) -> dict:
        return {
            "bootstrap": len(self.bootstrap),
            "inflight": len(self.inflight),
            "prealloc": len(self.prealloc),
            "transfer": len(self.transfer),
            "quarantined_pages": self.quarantined_pages(),
        }

    def quarantined_pages(self) -> int:
        return sum(len(q.pages) for q in self.quarantine)

    # --- entry -----------------------------------------------------------------------------------
    def _new_sender(self, req: Req):
        # SGLang: the sender's address is the request's host with our own bootstrap port.
        addr = f"{req.bootstrap_host}:{self.cfg.bootstrap_port}"
        cls = FakeKVSender if req.bootstrap_host == P.FAKE_BOOTSTRAP_HOST else KVSender
        return cls(self.mgr, addr, req.bootstrap_room)

    def _new_receiver(self, req: Req):
        port = req.bootstrap_port or self.cfg.bootstrap_port
        return KVReceiver(self.mgr, f"{req.bootstrap_host}:{port}", req.bootstrap_room)

    def add(self, req: Req) -> None:
        """Create the request's sender/receiver and queue it (exceptions fail the request)."""
        now = req.time_stats.now()
        if self.cfg.mode == "prefill":
            req.kv_sender = self.make_sender(req)
            req.time_stats.prefill_bootstrap_queue_entry_time = now
            self.bootstrap.append(req)
        else:
            req.kv_receiver = self.make_receiver(req)
            req.time_stats.decode_prealloc_queue_entry_time = now
            self.prealloc.append(req)

    def abort(self, req: Req) -> None:
        """Take `req` out of whichever queue holds it (PD or scheduler), abort its transfer and
        give its pages back."""
        s = self.sched
        for q in (self.bootstrap, self.inflight, self.prealloc, self.transfer):
            if req in q:
                q.remove(req)
        s.drop(req, release=False)
        self._close(req)

    # --- per step --------------------------------------------------------------------------------
    def poll(self) -> None:
        """Move requests on by their transfer state. A request whose endpoint raises, or whose aux
        is unusable, fails alone (502); the others go on."""
        self._expire_quarantine()
        for req in list(self.bootstrap):
            st = self._poll(self.bootstrap, req, req.kv_sender)
            if st == KVPoll.WaitingForInput:
                self.bootstrap.remove(req)
                self.sched.enqueue(req)
            elif st == KVPoll.Failed:
                hint = (
                    f"send the same request to a decode worker (bootstrap_host "
                    f"{req.bootstrap_host}) or use the fake host {P.FAKE_BOOTSTRAP_HOST} for a "
                    "prefill-only warm-up"
                )
                self._fail_peer(self.bootstrap, req, req.kv_sender, "bootstrap failed", hint)
        for req in list(self.inflight):
            st = self._poll(self.inflight, req, req.kv_sender)
            if st == KVPoll.Success:
                self.inflight.remove(req)
                req.time_stats.prefill_kv_transfer_finish_time = req.time_stats.now()
                req.kv_sender = None
                req.finish({"type": P.FINISH_LENGTH, "length": 1})
                self.sched.release(req)
                req.emit()
            elif st == KVPoll.Failed:
                self._fail_peer(self.inflight, req, req.kv_sender, "KV send failed")
        self._admit_decode()
        for req in list(self.transfer):
            st = self._poll(self.transfer, req, req.kv_receiver)
            if st == KVPoll.Success:
                self.transfer.remove(req)
                try:
                    self._start_decode(req)
                except Exception as e:  # bad aux from prefill fails this request only
                    logger.exception("rid=%s: cannot start decoding", req.rid)
                    self._fail([], req, 502, f"bad KV aux data from prefill: {e!r}")
            elif st == KVPoll.Failed:
                self._fail_peer(self.transfer, req, req.kv_receiver, "KV receive failed")

    def _poll(self, queue: list[Req], req: Req, peer) -> KVPoll | None:
        try:
            return peer.poll()
        except Exception as e:  # one broken transfer must not stop the engine
            logger.exception("rid=%s: KV transfer poll raised", req.rid)
            self._fail(queue, req, 502, f"KV transfer of room {req.bootstrap_room} broke: {e!r}")
            return None

    def _admit_decode(self) -> None:
        s = self.sched
        while self.prealloc and len(s.running) + len(self.transfer) < self.cfg.max_running_requests:
            req = self.prealloc[0]
            if not s.try_admit(req, s.kv_tokens_needed(req)):
                return  # pool full: wait, in order
            self.prealloc.pop(0)
            req.time_stats.decode_transfer_queue_entry_time = req.time_stats.now()
            self.transfer.append(req)
            prompt_pages = req.pages[: s.pool.pages_for(req.prompt_len)]
            try:
                req.kv_receiver.init(page_ranges(self.kv_buffer, prompt_pages, self.cfg.page_size))
            except Exception as e:  # noqa: BLE001 - any transport error fails this request only
                self._fail(self.transfer, req, 502, f"KV receiver init failed: {e}")

    def _start_decode(self, req: Req) -> None:
        aux = req.kv_receiver.aux() or {}
        first = int(aux[P.AUX_FIRST_TOKEN])  # KeyError: the caller fails the request
        req.kv_receiver = None
        req.time_stats.wait_queue_entry_time = req.time_stats.now()
        req.num_computed = req.prompt_len
        req.cached_tokens = int(aux.get(P.CACHED_TOKENS, 0))
        top = [tuple(x) for x in aux.get(P.AUX_TOP_LOGPROBS) or []]
        self.sched.append_token(req, first, aux.get(P.AUX_LOGPROB), top)
        if req.finished:
            self.sched.finish(req)
        else:
            self.sched.running.append(req)
            req.emit()

    def _send(self, req: Req) -> None:
        """Prefill done: ship the prompt's pages and the first token to decode."""
        pages = req.pages[: self.sched.pool.pages_for(req.prompt_len)]
        aux = {
            P.AUX_FIRST_TOKEN: req.output_ids[-1],
            P.CACHED_TOKENS: req.cached_tokens,
            P.PROMPT_TOKENS: req.prompt_len,
            P.AUX_LOGPROB: req.output_logprobs[-1] if req.output_logprobs else None,
            P.AUX_TOP_LOGPROBS: [list(t) for t in req.output_top_logprobs[-1]]
            if req.output_top_logprobs
            else [],
        }
        self.inflight.append(req)
        req.time_stats.prefill_transfer_queue_entry_time = req.time_stats.now()
        try:
            req.kv_sender.send(page_ranges(self.kv_buffer, pages, self.cfg.page_size), aux)
        except Exception as e:  # noqa: BLE001
            self._fail(self.inflight, req, 502, f"KV send failed: {e}")

    # --- failure ---------------------------------------------------------------------------------
    def _fail_peer(self, queue: list[Req], req: Req, peer, what: str, hint: str = "") -> None:
        reason = getattr(peer, "failure_reason", None)
        msg = f"{what}: {reason}" if reason else what
        self._fail(
            queue,
            req,
            504 if getattr(peer, "timed_out", False) else 502,
            f"{msg}; {hint}" if hint else msg,
        )

    def _close(self, req: Req) -> None:
        """Abort the request's transfer and release its pages (quarantined on decode while a
        prefill WRITE may still land in them)."""
        receiver = req.kv_receiver
        for peer in (req.kv_sender, receiver):
            if peer is not None:
                try:
                    peer.abort()
                except Exception:
                    logger.exception("abort of %s failed", req.rid)
        req.kv_sender = req.kv_receiver = None
        if receiver is not None and req.pages and _writes_possible(receiver):
            until = time.monotonic() + self.cfg.waiting_timeout_s
            self.quarantine.append(Quarantined(req.pages, receiver, until))
            req.pages = []  # release() below frees the row and reservation, not these pages
        self.sched.release(req)

    def _expire_quarantine(self) -> None:
        now, keep = time.monotonic(), []
        for q in self.quarantine:
            if now > q.until or not _writes_possible(q.receiver):
                self.sched.pool.free(q.pages)
            else:
                keep.append(q)
        self.quarantine = keep

    def _fail(self, queue: list[Req], req: Req, status: int, message: str) -> None:
        logger.warning("rid=%s room=%s failed: %s", req.rid, req.bootstrap_room, message)
        if req in queue:
            queue.remove(req)
        self.sched.drop(req, release=False)
        self._close(req)
        req.fail(message, status)
        req.emit()


def _writes_possible(receiver) -> bool:
    try:
        return bool(getattr(receiver, "writes_possible", False))
    except Exception:  # noqa: BLE001 - an endpoint that cannot tell: be safe until the deadline
        return True
