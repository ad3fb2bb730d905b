"""Scheduler: the one owner of a worker's request state. Every live request is in the table
(`reqs`) and in exactly one state, in that state's queue; every transition is a method here, run
only in the engine thread:

    null:     WAITING -> PREFILLING -> RUNNING -> DONE
    prefill:  BOOTSTRAP -> WAITING -> PREFILLING -> SENDING -> DONE   (SGLang: bootstrap, waiting,
                                                                       inflight queues)
    decode:   PREALLOC -> RECEIVING -> RUNNING -> DONE                (SGLang: prealloc, transfer)

and from any state to DONE by `abort` or a failed transfer. A step (engine.py): `poll` the
transfers, run the batches `schedule_prefill` / `schedule_decode` build, `process` their logits,
`reap` what is done. Pages belong to `PageAllocator`, transfer endpoints to `PDTransfer`.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sglang_ext import protocol as P
from sglang_ext.disagg import KVPoll, RoomInUseError
from sglang_ext.engine.config import EngineConfig
from sglang_ext.engine.forward_batch import ForwardBatch
from sglang_ext.engine.page_allocator import PageAllocator
from sglang_ext.engine.pd_transfer import PDTransfer, writes_possible
from sglang_ext.engine.request import Req, ReqState
from sglang_ext.engine.sampler import sample

logger = logging.getLogger(__name__)

S = ReqState
# The queues a PD request passes through besides the scheduler's own, and their stats names.
PD_QUEUES = {
    S.BOOTSTRAP: "bootstrap",
    S.SENDING: "inflight",
    S.PREALLOC: "prealloc",
    S.RECEIVING: "transfer",
}


@dataclass(slots=True)
class Batch:
    reqs: list[Req]
    forward: ForwardBatch
    ends: list[int]  # per request: tokens with KV after this forward
    is_prefill: bool


@dataclass(slots=True)
class Quarantined:
    """Decode pages of a request given up while prefill might still WRITE into them."""

    pages: list[int]
    receiver: Any
    until: float  # released at this time even if prefill never acknowledges the abort


class Scheduler:
    def __init__(
        self,
        cfg: EngineConfig,
        decode_text: Callable[[list[int]], str] | None = None,
        kv_manager=None,
        kv_buffer=None,
    ):
        self.cfg = cfg
        self.decode_text = decode_text
        self.pages = PageAllocator(cfg)
        self.pool, self.cache = self.pages.pool, self.pages.cache
        self.kv_transfer = PDTransfer(cfg, kv_manager, kv_buffer) if cfg.mode != "null" else None
        self.reqs: dict[str, Req] = {}
        self.queues: dict[ReqState, Any] = {s: [] for s in ReqState if s is not S.DONE}
        self.queues[S.WAITING] = deque()
        self.quarantine: list[Quarantined] = []
        self.default_gen = torch.Generator().manual_seed(cfg.random_seed)
        self.counters = dict.fromkeys(
            (
                "requests",
                "finished",
                "aborted",
                "failed",
                "prompt_tokens",
                "cached_tokens",
                "generated_tokens",
                "forward_steps",
            ),
            0,
        )

    @property
    def waiting(self) -> deque[Req]:
        return self.queues[S.WAITING]

    @property
    def prefilling(self) -> list[Req]:
        return self.queues[S.PREFILLING]

    @property
    def running(self) -> list[Req]:
        return self.queues[S.RUNNING]

    def _move(self, req: Req, state: ReqState) -> None:
        """The one place a request changes state (and queue)."""
        if req.state is not None and req.state is not S.DONE:
            self.queues[req.state].remove(req)
        req.state = state
        if state is not S.DONE:
            self.queues[state].append(req)

    def pending(self) -> bool:
        """Something may move without a new command (queued, running or transferring requests,
        decode pages in quarantine)."""
        return any(self.queues.values()) or bool(self.quarantine)

    # --- arrival ---------------------------------------------------------------------------------
    def kv_tokens_needed(self, req: Req) -> int:
        if self.cfg.mode == "prefill":
            return req.prompt_len
        return req.prompt_len + max(req.sampling.max_new_tokens, 1)

    def set_or_validate_priority(self, req: Req) -> bool:
        """As SGLang's scheduler on arrival: give a request without `priority` the default (else
        the lowest possible); False when this server refuses priorities and the request has one."""
        cfg = self.cfg
        if cfg.enable_priority_scheduling:
            if req.priority is None:
                req.priority = cfg.default_priority_value
            if req.priority is None:
                lowest_first = cfg.schedule_low_priority_values_first
                req.priority = sys.maxsize if lowest_first else -sys.maxsize - 1
            return True
        return req.priority is None or not cfg.abort_on_priority_when_disabled

    def add(self, req: Req) -> None:
        """A new request: refused (its reply says why), or queued in its first state."""
        c, cfg = self.counters, self.cfg
        c["requests"] += 1
        c["prompt_tokens"] += req.prompt_len
        if req.rid in self.reqs:
            return _reject(req, 400, f"rid '{req.rid}' is already in use by a live request")
        need = self.pool.pages_for(self.kv_tokens_needed(req))
        if need > cfg.num_pages:
            return _reject(
                req,
                503,
                (
                    f"the request needs {need} KV pages (prompt + max_new_tokens) but the pool has "
                    f"{cfg.num_pages}: lower max_new_tokens or raise --max-total-tokens"
                ),
            )
        queued = len(self.waiting) + sum(len(self.queues[s]) for s in PD_QUEUES)
        if queued >= cfg.max_queued_requests:
            return _reject(
                req,
                503,
                f"{queued} requests are already queued (--max-queued-requests); retry later",
            )
        if not self.set_or_validate_priority(req):
            return _reject(req, 503, P.PRIORITY_DISABLED_MESSAGE)
        now = req.time_stats.now()
        if self.kv_transfer is None:
            self.reqs[req.rid] = req
            return self._enqueue(req)
        try:
            self.kv_transfer.open(req)
        except Exception as e:  # noqa: BLE001 - e.g. a bootstrap host that does not resolve
            logger.warning("rid=%s: PD setup failed: %s", req.rid, e)
            status = 409 if isinstance(e, RoomInUseError) else 502
            msg = f"PD setup failed for bootstrap_room {req.bootstrap_room}: {e}"
            return _reject(req, status, msg)
        self.reqs[req.rid] = req
        if cfg.mode == "prefill":
            req.time_stats.prefill_bootstrap_queue_entry_time = now
            self._move(req, S.BOOTSTRAP)
        else:
            req.time_stats.decode_prealloc_queue_entry_time = now
            self._move(req, S.PREALLOC)

    def _enqueue(self, req: Req) -> None:
        req.time_stats.wait_queue_entry_time = req.time_stats.now()
        self._move(req, S.WAITING)

    # --- transfers (PD) --------------------------------------------------------------------------
    def poll(self) -> None:
        """Move PD requests on by their transfer state. A request whose endpoint raises, or whose
        aux is unusable, fails alone (502); the others go on."""
        if self.kv_transfer is None:
            return
        self._expire_quarantine()
        for req in list(self.queues[S.BOOTSTRAP]):
            st = self._poll(req, req.kv_sender)
            if st == KVPoll.WaitingForInput:
                self._enqueue(req)
            elif st == KVPoll.Failed:
                hint = (
                    f"send the same request to a decode worker (bootstrap_host "
                    f"{req.bootstrap_host}) or use the fake host {P.FAKE_BOOTSTRAP_HOST} for "
                    "a prefill-only warm-up"
                )
                self._fail(req, *PDTransfer.failure(req.kv_sender, "bootstrap failed", hint))
        for req in list(self.queues[S.SENDING]):
            st = self._poll(req, req.kv_sender)
            if st == KVPoll.Success:
                req.time_stats.prefill_kv_transfer_finish_time = req.time_stats.now()
                req.kv_sender = None
                req.finish({"type": P.FINISH_LENGTH, "length": 1})
                self._finish(req)
            elif st == KVPoll.Failed:
                self._fail(req, *PDTransfer.failure(req.kv_sender, "KV send failed"))
        self._admit_decode()
        for req in list(self.queues[S.RECEIVING]):
            st = self._poll(req, req.kv_receiver)
            if st == KVPoll.Success:
                try:
                    self._start_decode(req)
                except Exception as e:  # bad aux from prefill fails this request only
                    logger.exception("rid=%s: cannot start decoding", req.rid)
                    self._fail(req, 502, f"bad KV aux data from prefill: {e!r}")
            elif st == KVPoll.Failed:
                self._fail(req, *PDTransfer.failure(req.kv_receiver, "KV receive failed"))

    def _poll(self, req: Req, peer) -> KVPoll | None:
        try:
            return peer.poll()
        except Exception as e:  # one broken transfer must not stop the engine
            logger.exception("rid=%s: KV transfer poll raised", req.rid)
            self._fail(req, 502, f"KV transfer of room {req.bootstrap_room} broke: {e!r}")
            return None

    def _admit_decode(self) -> None:
        """Give free running slots and pages to preallocating requests, in queue order: by
        priority first when enabled (a stable sort, so arrival order within a priority), as
        SGLang's DecodePreallocQueue.pop_preallocated does. Under load this is where workflow
        priority acts: an older question's aggregator takes the next free decode slot before a
        newer question's leaves, and its prefill (held in bootstrap until decode is ready) with
        it."""
        prealloc, receiving = self.queues[S.PREALLOC], self.queues[S.RECEIVING]
        if not prealloc or len(self.running) + len(receiving) >= self.cfg.max_running_requests:
            return  # no slot free: nothing to order (this runs every step)
        if self.cfg.enable_priority_scheduling and len(prealloc) > 1:
            sign = self._priority_sign()
            prealloc.sort(key=lambda r: sign * r.priority)
        while prealloc and len(self.running) + len(receiving) < self.cfg.max_running_requests:
            req = prealloc[0]
            if not self.pages.try_admit(req, self.kv_tokens_needed(req)):
                return  # pool full: wait, in order
            req.time_stats.decode_transfer_queue_entry_time = req.time_stats.now()
            self._move(req, S.RECEIVING)
            prompt_pages = req.pages[: self.pool.pages_for(req.prompt_len)]
            try:
                req.kv_receiver.init(self.kv_transfer.ranges(prompt_pages))
            except Exception as e:  # noqa: BLE001 - any transport error fails this request only
                self._fail(req, 502, f"KV receiver init failed: {e}")

    def _start_decode(self, req: Req) -> None:
        first = self.kv_transfer.first_token(req)  # raises on bad aux: the caller fails req
        req.kv_receiver = None
        # SGLang's decode: the KV arrived (waiting queue), and its first "forward" is the
        # prebuilt batch that emits the token prefill sampled: here at once.
        ts = req.time_stats
        ts.wait_queue_entry_time = ts.forward_entry_time = ts.now()
        req.num_computed = req.prompt_len
        req.cached_tokens = first.cached_tokens
        self.append_token(req, first.token, first.logprob, first.top_logprobs)
        if req.finished:
            self._finish(req)
        else:
            self._move(req, S.RUNNING)
            req.emit()

    def _send(self, req: Req) -> None:
        """Prefill done: ship the prompt's pages and the first token to decode."""
        self._move(req, S.SENDING)
        req.time_stats.prefill_transfer_queue_entry_time = req.time_stats.now()
        try:
            self.kv_transfer.send(req, req.pages[: self.pool.pages_for(req.prompt_len)])
        except Exception as e:  # noqa: BLE001
            self._fail(req, 502, f"KV send failed: {e}")

    def _expire_quarantine(self) -> None:
        now, keep = time.monotonic(), []
        for q in self.quarantine:
            if now > q.until or not writes_possible(q.receiver):
                self.pool.free(q.pages)
            else:
                keep.append(q)
        self.quarantine = keep

    def quarantined_pages(self) -> int:
        return sum(len(q.pages) for q in self.quarantine)

    # --- batches ---------------------------------------------------------------------------------
    def _priority_sign(self) -> int:
        """Sorting by sign * priority puts the first-served first (larger values unless
        --schedule-low-priority-values-first)."""
        return 1 if self.cfg.schedule_low_priority_values_first else -1

    def _sort_waiting(self) -> None:
        # SGLang's fcfs + priority: by priority, then by when the request entered the waiting
        # queue.
        sign = self._priority_sign()
        self.queues[S.WAITING] = deque(
            sorted(
                self.waiting, key=lambda r: (sign * r.priority, r.time_stats.wait_queue_entry_time)
            )
        )

    def schedule_prefill(self) -> Batch | None:
        """Started prefills go on first (never preempted, as SGLang's chunked request); the budget
        left admits waiting requests in queue order (sorted by priority when enabled). A request
        leaves the waiting queue only when it gets tokens in this very batch."""
        budget = self.cfg.max_prefill_tokens
        reqs, ends = [], []

        def take(req: Req) -> None:
            nonlocal budget
            n = min(req.prompt_len - req.num_computed, budget, self.cfg.chunked_prefill_size)
            reqs.append(req)
            ends.append(req.num_computed + n)
            budget -= n

        for req in self.prefilling:
            if budget <= 0:
                break
            take(req)
        if self.cfg.enable_priority_scheduling and len(self.waiting) > 1:
            self._sort_waiting()
        while (
            budget > 0
            and self.waiting
            and len(self.prefilling) + len(self.running) < self.cfg.max_running_requests
            and self.pages.try_admit(self.waiting[0], self.kv_tokens_needed(self.waiting[0]))
        ):
            req = self.waiting[0]
            self._move(req, S.PREFILLING)
            req.time_stats.forward_entry_time = req.time_stats.now()
            take(req)
        if not reqs:
            return None
        slots = [self.pages.req_to_token.slots(r.row, 0, e) for r, e in zip(reqs, ends)]
        new = [r.input_ids[r.num_computed : e] for r, e in zip(reqs, ends)]
        return Batch(reqs, ForwardBatch.build(slots, new), ends, True)

    def schedule_decode(self) -> Batch | None:
        if not self.running:
            return None
        reqs = list(self.running)
        for r in reqs:
            self.pages.grow(r, r.seq_len)
        slots = [self.pages.req_to_token.slots(r.row, 0, r.seq_len) for r in reqs]
        return Batch(
            reqs,
            ForwardBatch.build(slots, [[r.output_ids[-1]] for r in reqs]),
            [r.seq_len for r in reqs],
            False,
        )

    def process(
        self, batch: Batch, logits: torch.Tensor, started: float = 0.0, ended: float = 0.0
    ) -> None:
        """Sample the sequences that completed their prompt or decoded; move requests on.
        `started`/`ended`: when the batch's forward ran (perf_counter)."""
        for r, e in zip(batch.reqs, batch.ends):
            r.num_computed = e
            if batch.is_prefill:  # SGLang's prefill_run_batch_{start,end}_time: last batch wins
                r.time_stats.prefill_run_batch_start_time = started
                r.time_stats.prefill_run_batch_end_time = ended
        idx = [
            i
            for i, (r, e) in enumerate(zip(batch.reqs, batch.ends))
            if not batch.is_prefill or e == r.prompt_len
        ]
        if not idx:
            return
        reqs = [batch.reqs[i] for i in idx]
        if batch.is_prefill:
            now = reqs[0].time_stats.now()
            for req in reqs:
                req.time_stats.prefill_finished_time = now
        out = sample(logits[idx], reqs, self.default_gen)
        for j, req in enumerate(reqs):
            self.append_token(
                req,
                out.ids[j],
                out.logprobs[j] if out.logprobs else None,
                out.top_logprobs[j] if out.top_logprobs else [],
            )
            if batch.is_prefill and self.cfg.mode == "prefill":
                self._send(req)
            elif req.finished:
                self._finish(req)
            else:
                if batch.is_prefill:
                    self._move(req, S.RUNNING)
                req.emit()

    def append_token(self, req: Req, tok: int, logprob: float | None, top: list) -> None:
        req.output_ids.append(tok)
        if req.return_logprob:
            req.output_logprobs.append(logprob if logprob is not None else 0.0)
            req.output_top_logprobs.append(top)
        self.check_finish(req)

    def check_finish(self, req: Req) -> None:
        sp, tok, n = req.sampling, req.output_ids[-1], len(req.output_ids)
        if n >= sp.min_new_tokens:
            if tok in sp.stop_token_ids or (not sp.ignore_eos and tok in req.eos_token_ids):
                return req.finish({"type": P.FINISH_STOP, "matched": tok})
            if sp.stop and self.decode_text is not None:
                # A stop string that ends in the new token lies within its last len(stop)
                # tokens (a token is at least one character); a few more cover tokens that
                # decode to nothing alone. Decoding only that tail keeps this O(1) per token.
                tail = self.decode_text(req.output_ids[-(max(map(len, sp.stop)) + 8) :])
                for s in sp.stop:
                    if s in tail:
                        return req.finish({"type": P.FINISH_STOP, "matched": s})
        if n >= max(sp.max_new_tokens, 1):
            req.finish({"type": P.FINISH_LENGTH, "length": sp.max_new_tokens})

    # --- leaving ---------------------------------------------------------------------------------
    def _finish(self, req: Req) -> None:
        """A normal end: free the request's pages and send its last chunk."""
        req.time_stats.completion_time = req.time_stats.now()
        self._move(req, S.DONE)
        self.pages.release(req)
        req.emit()

    def _close(self, req: Req) -> None:
        """Out of its queue, its transfer aborted, its pages back (quarantined on decode while a
        prefill WRITE may still land in them)."""
        self._move(req, S.DONE)
        receiver = PDTransfer.close(req)
        if receiver is not None and req.pages:
            # Only the prompt's pages are prefill's WRITE destination; release() below frees the
            # rest (the pages decoding would have written), the row and the reservation.
            prompt = self.pool.pages_for(req.prompt_len)
            until = time.monotonic() + self.cfg.waiting_timeout_s
            self.quarantine.append(Quarantined(req.pages[:prompt], receiver, until))
            req.pages = req.pages[prompt:]
        self.pages.release(req)

    def _fail(self, req: Req, status: int, message: str) -> None:
        """A failure in the request's transfer: it ends alone; `reap` counts it."""
        logger.warning("rid=%s room=%s failed: %s", req.rid, req.bootstrap_room, message)
        self._close(req)
        req.fail(message, status)
        req.emit()

    def abort(self, req: Req, message: str, status: int = 200) -> bool:
        """Abort a live request from whatever state it is in (status 200: by request)."""
        self._close(req)
        del self.reqs[req.rid]
        req.fail(message, status)
        req.emit()
        self.counters["finished"] += 1
        self.counters["aborted" if status == 200 else "failed"] += 1
        return True

    def reap(self) -> None:
        """Drop DONE requests from the table. A prefill request stays live in SENDING while its
        KV is being sent (it holds pages and a KVSender): aborts, flush and integrity see it."""
        for rid, req in list(self.reqs.items()):
            if req.state is S.DONE:
                del self.reqs[rid]
                c = self.counters
                c["finished"] += 1
                c["generated_tokens"] += len(req.output_ids)
                c["cached_tokens"] += req.cached_tokens
                if req.finish_reason.get("type") == P.FINISH_ABORT:
                    c["aborted" if req.status == 200 else "failed"] += 1

    # --- introspection ---------------------------------------------------------------------------
    def page_stats(self) -> dict:
        out = self.pages.stats()
        out["num_running_reqs"] = len(self.running) + len(self.prefilling)
        out["num_waiting_reqs"] = len(self.waiting)
        return out

    def stats(self) -> dict:
        out = self.page_stats()
        if self.kv_transfer is not None:
            out.update({f"pd_{name}": len(self.queues[s]) for s, name in PD_QUEUES.items()})
            out["pd_quarantined_pages"] = self.quarantined_pages()
        out["num_live_reqs"] = len(self.reqs)
        out.update(self.counters)
        return out

    def check_integrity(self) -> None:
        """Pages add up, and every live request sits in exactly the queue of its state."""
        live = list(self.reqs.values())
        self.pages.check_integrity(live, self.quarantined_pages())
        queued = [r for q in self.queues.values() for r in q]
        assert len(queued) == len({id(r) for r in queued}), "a request is in two queues"
        assert all(r.state is not S.DONE and r in self.queues[r.state] for r in live), (
            "a live request is not in its state's queue"
        )
        assert all(self.reqs.get(r.rid) is r for r in queued), "a queued request is not live"

    def flush_cache(self) -> bool:
        """Drop the radix cache; refused (False) while anything is live or queued (a request's
        pages may be locked in the tree or still being sent), as SGLang does. A worker without
        one (decode) has nothing to flush and succeeds when idle, as SGLang's does."""
        if self.reqs or self.pending():
            return False
        if self.cache is not None:
            self.cache.reset()
        return True


def _reject(req: Req, status: int, message: str) -> None:
    req.fail(message, status)
    req.emit()
