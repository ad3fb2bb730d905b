"""Scheduler: every request state transition of one worker (waiting → prefilling → running → done).

Called only from the engine thread: `schedule_prefill` / `schedule_decode` build a `Batch`, the
engine runs the model, `process` samples and moves requests on. Pages are admitted by
reservation: a request is admitted only when the pages for its whole prompt + max_new_tokens fit
(free + evictable - already reserved), so a decode step never runs out of pages.
"""

from __future__ import annotations

import logging
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from sglang_ext import protocol as P
from sglang_ext.engine.config import EngineConfig
from sglang_ext.engine.forward_batch import ForwardBatch
from sglang_ext.engine.kv_pool import PagePool, ReqToTokenPool
from sglang_ext.engine.radix_cache import RadixCache
from sglang_ext.engine.request import Req
from sglang_ext.engine.sampler import sample

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Batch:
    reqs: list[Req]
    forward: ForwardBatch
    ends: list[int]  # per request: tokens with KV after this forward
    is_prefill: bool


class Scheduler:
    def __init__(self, cfg: EngineConfig, decode_text: Callable[[list[int]], str] | None = None):
        self.cfg = cfg
        self.pool = PagePool(cfg.num_pages, cfg.page_size)
        self.req_to_token = ReqToTokenPool(
            cfg.max_running_requests, cfg.context_length + 1, cfg.page_size
        )
        self.cache = RadixCache(self.pool) if cfg.uses_radix_cache else None
        self.decode_text = decode_text
        self.waiting: deque[Req] = deque()
        self.prefilling: list[Req] = []
        self.running: list[Req] = []
        self.reserved = 0  # pages promised to admitted requests, not yet allocated
        self.default_gen = torch.Generator().manual_seed(cfg.random_seed)
        # Set by the engine in PD mode: called when a prefill finishes, instead of decoding on.
        self.on_prefill_done: Callable[[Req], None] | None = None

    # --- pages -----------------------------------------------------------------------------------
    def available_pages(self) -> int:
        evictable = self.cache.evictable_size() // self.cfg.page_size if self.cache else 0
        return self.pool.num_free + evictable - self.reserved

    def alloc_pages(self, n: int) -> list[int]:
        if self.pool.num_free < n and self.cache is not None:
            self.cache.evict(n - self.pool.num_free)
        return self.pool.alloc(n)

    def try_admit(self, req: Req, kv_tokens: int) -> bool:
        """Give `req` a row, its cached prefix (locked), pages for its prompt, and a reservation
        for the rest of `kv_tokens`. False (nothing changed) when they do not fit yet."""
        ps = self.cfg.page_size
        if self.req_to_token.num_free == 0:
            return False
        prefix, node = [], None
        if self.cache is not None:
            # At least the last prompt token is recomputed: its logits give the first new token.
            prefix, node = self.cache.match_prefix(req.input_ids[: req.prompt_len - 1])
            self.cache.inc_lock_ref(node)
        need = self.pool.pages_for(kv_tokens) - len(prefix)
        if need > self.available_pages():
            if node is not None:
                self.cache.dec_lock_ref(node)
            return False
        prompt_new = self.pool.pages_for(req.prompt_len) - len(prefix)
        req.row = self.req_to_token.alloc()
        req.pages = prefix + self.alloc_pages(prompt_new)
        req.num_prefix_pages, req.last_node = len(prefix), node
        req.cached_tokens = req.num_computed = len(prefix) * ps
        req.reserved_pages = need - prompt_new
        self.reserved += req.reserved_pages
        self.req_to_token.write_pages(req.row, 0, req.pages)
        return True

    def grow(self, req: Req, num_tokens: int) -> None:
        """Make sure pages cover `num_tokens` tokens, drawing on the request's reservation."""
        missing = self.pool.pages_for(num_tokens) - len(req.pages)
        if missing > 0:
            new = self.alloc_pages(missing)
            take = min(missing, req.reserved_pages)
            req.reserved_pages -= take
            self.reserved -= take
            self.req_to_token.write_pages(req.row, len(req.pages), new)
            req.pages.extend(new)

    def release(self, req: Req) -> None:
        """Return a request's pages: computed whole pages go into the radix cache (null/prefill),
        the rest to the pool. Idempotent."""
        if req.row is None:
            return
        ps = self.cfg.page_size
        own_from = req.num_prefix_pages
        if self.cache is not None:
            aligned = req.num_computed // ps
            done = self.cache.insert(req.all_ids[: aligned * ps], req.pages[:aligned])
            # [num_prefix_pages, done) were cached meanwhile by another request: ours are copies.
            self.pool.free(req.pages[own_from : max(own_from, done // ps)])
            own_from = aligned
            self.cache.dec_lock_ref(req.last_node)
        self.pool.free(req.pages[own_from:])
        self.reserved -= req.reserved_pages
        req.reserved_pages, req.pages, req.last_node = 0, [], None
        self.req_to_token.free(req.row)
        req.row = None

    def kv_tokens_needed(self, req: Req) -> int:
        if self.cfg.mode == "prefill":
            return req.prompt_len
        return req.prompt_len + max(req.sampling.max_new_tokens, 1)

    # --- priority (SGLang's --enable-priority-scheduling) ---------------------------------------
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

    def enqueue(self, req: Req) -> None:
        """Into the waiting queue (for prefill: once decode's destination is known)."""
        req.time_stats.wait_queue_entry_time = req.time_stats.now()
        self.waiting.append(req)

    def _sort_waiting(self) -> None:
        # SGLang's fcfs + priority: by priority (larger first unless low values first), then by
        # when the request entered the waiting queue.
        sign = 1 if self.cfg.schedule_low_priority_values_first else -1
        self.waiting = deque(
            sorted(
                self.waiting,
                key=lambda r: (sign * r.priority, r.time_stats.wait_queue_entry_time),
            )
        )

    # --- batches ---------------------------------------------------------------------------------
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
            and self.try_admit(self.waiting[0], self.kv_tokens_needed(self.waiting[0]))
        ):
            req = self.waiting.popleft()
            self.prefilling.append(req)
            req.time_stats.forward_entry_time = req.time_stats.now()
            take(req)
        if not reqs:
            return None
        slots = [self.req_to_token.slots(r.row, 0, e) for r, e in zip(reqs, ends)]
        new = [r.input_ids[r.num_computed : e] for r, e in zip(reqs, ends)]
        return Batch(reqs, ForwardBatch.build(slots, new), ends, True)

    def schedule_decode(self) -> Batch | None:
        if not self.running:
            return None
        reqs = list(self.running)
        for r in reqs:
            self.grow(r, r.seq_len)
            if r.time_stats.forward_entry_time == 0:  # decode worker: its first forward here
                r.time_stats.forward_entry_time = r.time_stats.now()
        slots = [self.req_to_token.slots(r.row, 0, r.seq_len) for r in reqs]
        return Batch(
            reqs,
            ForwardBatch.build(slots, [[r.output_ids[-1]] for r in reqs]),
            [r.seq_len for r in reqs],
            False,
        )

    def process(self, batch: Batch, logits: torch.Tensor) -> None:
        """Sample the sequences that completed their prompt or decoded; move requests on."""
        idx = [
            i
            for i, (r, e) in enumerate(zip(batch.reqs, batch.ends))
            if not batch.is_prefill or e == r.prompt_len
        ]
        for r, e in zip(batch.reqs, batch.ends):
            r.num_computed = e
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
            if batch.is_prefill:
                self.prefilling.remove(req)
                if self.on_prefill_done is not None:
                    self.on_prefill_done(req)
                    continue
                if not req.finished:
                    self.running.append(req)
            if req.finished:
                self.finish(req)
            else:
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

    def drop(self, req: Req, release: bool = True) -> None:
        """Take `req` out of the scheduler's queues (and free its pages unless told not to)."""
        for q in (self.waiting, self.prefilling, self.running):
            if req in q:
                q.remove(req)
        if release:
            self.release(req)

    def finish(self, req: Req) -> None:
        """Free a finished request and send its last chunk."""
        req.time_stats.completion_time = req.time_stats.now()
        self.drop(req)
        req.emit()

    # --- introspection ---------------------------------------------------------------------------
    def page_stats(self) -> dict:
        ps = self.cfg.page_size
        cached = self.cache.total_size() // ps if self.cache else 0
        return {
            "page_size": ps,
            "total_pages": self.pool.num_pages,
            "free_pages": self.pool.num_free,
            "cached_pages": cached,
            "evictable_pages": self.cache.evictable_size() // ps if self.cache else 0,
            "in_use_pages": self.pool.num_pages - self.pool.num_free - cached,
            "reserved_pages": self.reserved,
            "num_running_reqs": len(self.running) + len(self.prefilling),
            "num_waiting_reqs": len(self.waiting),
        }

    def check_integrity(self, live: list[Req], other_held: int = 0) -> None:
        """free + cached + pages held by live requests (beyond their cached prefix) + pages held
        elsewhere (decode's quarantine) == total."""
        if self.cache is not None:
            self.cache.check_integrity()
        held = other_held + sum(
            len(r.pages) - r.num_prefix_pages for r in live if r.row is not None
        )
        cached = self.cache.total_size() // self.cfg.page_size if self.cache else 0
        assert self.pool.num_free + cached + held == self.pool.num_pages, (
            f"page leak: free {self.pool.num_free} + cached {cached} + held {held} "
            f"!= total {self.pool.num_pages}"
        )
        assert self.reserved == sum(r.reserved_pages for r in live), "reservation drift"
