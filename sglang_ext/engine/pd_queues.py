"""PD queues around the scheduler, as SGLang names them: prefill bootstrap + inflight, decode
prealloc + transfer. Called from the engine thread each step (`poll`) and on add/abort.

Prefill: wait for decode's destination (WaitingForInput) → admit and prefill → send the prompt's
pages + aux (first token, logprobs, cached_tokens) → on Success cache the prompt and reply.
Decode: admit when pages fit → KVReceiver.init(dst pages) → on Success take the first token from
aux and decode on as a normal running request.
"""

from __future__ import annotations

import logging
import time

from sglang_ext import protocol as P
from sglang_ext.engine.request import Req
from sglang_ext.engine.scheduler import Scheduler

logger = logging.getLogger(__name__)


class PDQueues:
    def __init__(self, sched: Scheduler, kv_manager, kv_buffer):
        from sglang_ext.disagg import KVPoll, page_ranges

        self.sched, self.cfg = sched, sched.cfg
        self.mgr, self.kv_buffer = kv_manager, kv_buffer
        self.KVPoll, self.page_ranges = KVPoll, page_ranges
        self.bootstrap: list[Req] = []  # prefill: waiting for decode's destination
        self.inflight: list[Req] = []  # prefill: KV being sent
        self.prealloc: list[Req] = []  # decode: waiting for pages
        self.transfer: list[Req] = []  # decode: KV being received
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
        }

    # --- entry -----------------------------------------------------------------------------------
    def add(self, req: Req) -> None:
        """Create the request's sender/receiver and queue it (exceptions fail the request)."""
        now = time.monotonic()
        if self.cfg.mode == "prefill":
            from sglang_ext.disagg import FakeKVSender, KVSender

            # SGLang: the sender's address is the request's host with our own bootstrap port.
            addr = f"{req.bootstrap_host}:{self.cfg.bootstrap_port}"
            cls = FakeKVSender if req.bootstrap_host == P.FAKE_BOOTSTRAP_HOST else KVSender
            req.kv_sender = cls(self.mgr, addr, req.bootstrap_room)
            req.pd_deadline = now + self.cfg.bootstrap_timeout_s
            self.bootstrap.append(req)
        else:
            from sglang_ext.disagg import KVReceiver

            port = req.bootstrap_port or self.cfg.bootstrap_port
            req.kv_receiver = KVReceiver(
                self.mgr, f"{req.bootstrap_host}:{port}", req.bootstrap_room
            )
            req.pd_deadline = now + self.cfg.waiting_timeout_s
            self.prealloc.append(req)

    def abort(self, req: Req) -> bool:
        for q in (self.bootstrap, self.inflight, self.prealloc, self.transfer):
            if req in q:
                q.remove(req)
                self._close(req)
                return True
        return False

    # --- per step --------------------------------------------------------------------------------
    def poll(self) -> None:
        now, S = time.monotonic(), self.KVPoll
        for req in list(self.bootstrap):
            st = req.kv_sender.poll()
            if st == S.WaitingForInput:
                self.bootstrap.remove(req)
                req.pd_deadline = now + self.cfg.waiting_timeout_s
                self.sched.waiting.append(req)
            elif st == S.Failed:
                self._fail(self.bootstrap, req, 502, self._why(req.kv_sender, "bootstrap failed"))
            elif now > req.pd_deadline:
                self._fail(
                    self.bootstrap,
                    req,
                    504,
                    (
                        f"no decode worker connected for room {req.bootstrap_room} within "
                        f"{self.cfg.bootstrap_timeout_s:.0f}s: send the same request to a decode "
                        f"worker (bootstrap_host {req.bootstrap_host}) or use the fake host "
                        f"{P.FAKE_BOOTSTRAP_HOST} for a prefill-only warm-up"
                    ),
                )
        for req in list(self.inflight):
            st = req.kv_sender.poll()
            if st == S.Success:
                self.inflight.remove(req)
                req.kv_sender = None
                req.finish({"type": P.FINISH_LENGTH, "length": 1})
                self.sched.release(req)
                req.emit()
            elif st == S.Failed or now > req.pd_deadline:
                self._fail(self.inflight, req, 502, self._why(req.kv_sender, "KV send failed"))
        self._admit_decode()
        for req in list(self.transfer):
            st = req.kv_receiver.poll()
            if st == S.Success:
                self.transfer.remove(req)
                self._start_decode(req)
            elif st == S.Failed:
                self._fail(self.transfer, req, 502, self._why(req.kv_receiver, "KV receive failed"))
            elif now > req.pd_deadline:
                self._fail(
                    self.transfer,
                    req,
                    504,
                    (
                        f"the KV of room {req.bootstrap_room} did not arrive from the prefill "
                        f"worker at {req.bootstrap_host} within {self.cfg.waiting_timeout_s:.0f}s"
                    ),
                )

    def _admit_decode(self) -> None:
        s = self.sched
        while self.prealloc and len(s.running) + len(self.transfer) < self.cfg.max_running_requests:
            req = self.prealloc[0]
            if not s.try_admit(req, s.kv_tokens_needed(req)):
                return  # pool full: wait, in order
            self.prealloc.pop(0)
            prompt_pages = req.pages[: s.pool.pages_for(req.prompt_len)]
            try:
                req.kv_receiver.init(
                    self.page_ranges(self.kv_buffer, prompt_pages, self.cfg.page_size)
                )
            except Exception as e:  # noqa: BLE001 - any transport error fails this request only
                self.transfer.append(req)
                self._fail(self.transfer, req, 502, f"KV receiver init failed: {e}")
                continue
            self.transfer.append(req)

    def _start_decode(self, req: Req) -> None:
        aux = req.kv_receiver.aux() or {}
        req.kv_receiver = None
        req.num_computed = req.prompt_len
        req.cached_tokens = int(aux.get(P.CACHED_TOKENS, 0))
        top = [tuple(x) for x in aux.get("top_logprobs") or []]
        self.sched.append_token(req, int(aux["first_token"]), aux.get("logprob"), top)
        if req.finished:
            self.sched.finish(req)
        else:
            self.sched.running.append(req)
            req.emit()

    def _send(self, req: Req) -> None:
        """Prefill done: ship the prompt's pages and the first token to decode."""
        pages = req.pages[: self.sched.pool.pages_for(req.prompt_len)]
        aux = {
            "first_token": req.output_ids[-1],
            P.CACHED_TOKENS: req.cached_tokens,
            P.PROMPT_TOKENS: req.prompt_len,
            "logprob": req.output_logprobs[-1] if req.output_logprobs else None,
            "top_logprobs": [list(t) for t in req.output_top_logprobs[-1]]
            if req.output_top_logprobs
            else [],
        }
        self.inflight.append(req)
        try:
            req.kv_sender.send(self.page_ranges(self.kv_buffer, pages, self.cfg.page_size), aux)
        except Exception as e:  # noqa: BLE001
            self._fail(self.inflight, req, 502, f"KV send failed: {e}")

    # --- failure ---------------------------------------------------------------------------------
    @staticmethod
    def _why(peer, what: str) -> str:
        reason = getattr(peer, "failure_reason", None)
        return f"{what}: {reason}" if reason else what

    def _close(self, req: Req) -> None:
        for peer in (req.kv_sender, req.kv_receiver):
            if peer is not None:
                try:
                    peer.abort()
                except Exception:
                    logger.exception("abort of %s failed", req.rid)
        req.kv_sender = req.kv_receiver = None
        self.sched.release(req)

    def _fail(self, queue: list[Req], req: Req, status: int, message: str) -> None:
        logger.warning("rid=%s room=%s failed: %s", req.rid, req.bootstrap_room, message)
        if req in queue:
            queue.remove(req)
        self._close(req)
        req.finish({"type": P.FINISH_ABORT, "message": message}, status)
        req.emit()
