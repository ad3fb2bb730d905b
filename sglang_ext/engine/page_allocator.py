"""`PageAllocator`: a worker's KV pages as requests hold them: the page pool, the req-to-token
table, the radix cache (null and prefill workers), and the reservations of admitted requests.

Owned and called only by the scheduler (engine thread). Admission is by reservation: a request is
admitted only when the pages for its whole prompt + max_new_tokens fit (free + evictable - already
reserved), so a decode step never runs out of pages. Plain Python: testable without a model.
"""

from __future__ import annotations

from sglang_ext.engine.config import EngineConfig
from sglang_ext.engine.kv_pool import PagePool, ReqToTokenPool
from sglang_ext.engine.radix_cache import RadixCache
from sglang_ext.engine.request import Req


class PageAllocator:
    def __init__(self, cfg: EngineConfig):
        self.page_size = cfg.page_size
        self.pool = PagePool(cfg.num_pages, cfg.page_size)
        self.req_to_token = ReqToTokenPool(
            cfg.max_running_requests, cfg.context_length + 1, cfg.page_size
        )
        self.cache = RadixCache(self.pool) if cfg.uses_radix_cache else None
        self.reserved = 0  # pages promised to admitted requests, not yet allocated
        # A decode worker takes a request's whole reservation as pages at admission, in one
        # block. Drawn a page per step instead, the running streams' pages interleave (A, B, C,
        # A, B, C, ...), and once those streams end every later prompt lands on pages with no two
        # consecutive: its KV then travels as one range per page and layer (60 per token for
        # SmolLM2), and the handshake's JSON and the NIXL WRITE's descriptors grow with it. After
        # six questions the bootstrap of an idle PD pair's 480-token prompt took 43-183 ms and its
        # transfer ~96 ms, against 3 and 8 ms on fresh pages. Capacity is unchanged: the reserved
        # pages counted as taken either way, and a decode worker has no radix cache to evict.
        self.whole_reservation = cfg.mode == "decode"

    def available(self) -> int:
        evictable = self.cache.evictable_size() // self.page_size if self.cache else 0
        return self.pool.num_free + evictable - self.reserved

    def alloc(self, n: int) -> list[int]:
        if self.pool.num_free < n and self.cache is not None:
            self.cache.evict(n - self.pool.num_free)
        return self.pool.alloc(n)

    def try_admit(self, req: Req, kv_tokens: int) -> bool:
        """Give `req` a row, its cached prefix (locked), pages for its prompt, and a reservation
        for the rest of `kv_tokens`. False (nothing changed) when they do not fit yet."""
        if self.req_to_token.num_free == 0:
            return False
        prefix, node = [], None
        if self.cache is not None:
            # At least the last prompt token is recomputed: its logits give the first new token.
            prefix, node = self.cache.match_prefix(req.input_ids[: req.prompt_len - 1])
            self.cache.inc_lock_ref(node)
        need = self.pool.pages_for(kv_tokens) - len(prefix)
        if need > self.available():
            if node is not None:
                self.cache.dec_lock_ref(node)
            return False
        now = need if self.whole_reservation else self.pool.pages_for(req.prompt_len) - len(prefix)
        req.row = self.req_to_token.alloc()
        req.pages = prefix + self.alloc(now)
        req.num_prefix_pages, req.last_node = len(prefix), node
        req.cached_tokens = req.num_computed = len(prefix) * self.page_size
        req.reserved_pages = need - now
        self.reserved += req.reserved_pages
        self.req_to_token.write_pages(req.row, 0, req.pages)
        return True

    def grow(self, req: Req, num_tokens: int) -> None:
        """Make sure pages cover `num_tokens` tokens, drawing on the request's reservation."""
        missing = self.pool.pages_for(num_tokens) - len(req.pages)
        if missing > 0:
            new = self.alloc(missing)
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
        ps = self.page_size
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

    def stats(self) -> dict:
        ps = self.page_size
        cached = self.cache.total_size() // ps if self.cache else 0
        return {
            "page_size": ps,
            "total_pages": self.pool.num_pages,
            "free_pages": self.pool.num_free,
            "cached_pages": cached,
            "evictable_pages": self.cache.evictable_size() // ps if self.cache else 0,
            "in_use_pages": self.pool.num_pages - self.pool.num_free - cached,
            "reserved_pages": self.reserved,
        }

    def check_integrity(self, live: list[Req], other_held: int = 0) -> None:
        """free + cached + pages held by live requests (beyond their cached prefix) + pages held
        elsewhere (decode's quarantine) == total."""
        if self.cache is not None:
            self.cache.check_integrity()
        held = other_held + sum(
            len(r.pages) - r.num_prefix_pages for r in live if r.row is not None
        )
        cached = self.cache.total_size() // self.page_size if self.cache else 0
        assert self.pool.num_free + cached + held == self.pool.num_pages, (
            f"page leak: free {self.pool.num_free} + cached {cached} + held {held} "
            f"!= total {self.pool.num_pages}"
        )
        assert self.reserved == sum(r.reserved_pages for r in live), "reservation drift"
