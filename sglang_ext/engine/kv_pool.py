"""KV bookkeeping: `PagePool` hands out page ids of the KV buffer, `ReqToTokenPool` maps each
running request's token positions to KV slots (SGLang's req_to_token table). Used by the scheduler.

A slot is `page * page_size + offset`; the model reads and writes the KV buffer by slot.
"""

from __future__ import annotations

import torch


class OutOfPagesError(RuntimeError):
    """Raised by PagePool.alloc when fewer pages are free than asked for (callers check first)."""


class PagePool:
    """Free list over `num_pages` pages. Plain Python so cache and scheduler tests need no torch."""

    def __init__(self, num_pages: int, page_size: int):
        self.num_pages = num_pages
        self.page_size = page_size
        # Low page ids first: keeps the KV buffer's hot region small and test output readable.
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._is_free = [True] * num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    def can_alloc(self, n: int) -> bool:
        return n <= len(self._free)

    def alloc(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfPagesError(f"asked for {n} pages, {len(self._free)} free")
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self._is_free[p] = False
        return pages

    def free(self, pages: list[int]) -> None:
        """Return pages to the free list, last first, so that the next `alloc` hands a freed run
        out again in its own (ascending) order. Pushed in the given order, a LIFO list would hand
        it out backwards, every page a run of its own: a PD request's KV then travels as one NIXL
        descriptor per page and layer (60 per token for SmolLM2) instead of one per run, and its
        bootstrap and transfer took ~0.2 s each for a 1,000-token prompt, every second request."""
        for p in pages:
            if self._is_free[p]:
                raise RuntimeError(f"double free of page {p}")
            self._is_free[p] = True
        self._free.extend(reversed(pages))

    def pages_for(self, num_tokens: int) -> int:
        """Pages needed to hold `num_tokens` tokens."""
        return -(-num_tokens // self.page_size)


class ReqToTokenPool:
    """Rows of slot ids, one row per running request, `max_context_len` columns.

    Row r, column i holds the KV slot of token i of the request in row r; the model's
    ForwardBatch takes `table[r, :seq_len]` as that sequence's slots.
    """

    def __init__(self, num_rows: int, max_context_len: int, page_size: int):
        self.page_size = page_size
        self.max_context_len = max_context_len
        self.table = torch.zeros((num_rows, max_context_len), dtype=torch.int64)
        self._free_rows = list(range(num_rows - 1, -1, -1))
        self._offsets = torch.arange(page_size, dtype=torch.int64)

    @property
    def num_free(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int | None:
        return self._free_rows.pop() if self._free_rows else None

    def free(self, row: int) -> None:
        self._free_rows.append(row)

    def write_pages(self, row: int, first_page_index: int, pages: list[int]) -> None:
        """Record that the request's pages number first_page_index.. are `pages`."""
        if not pages:
            return
        start = first_page_index * self.page_size
        end = min(start + len(pages) * self.page_size, self.max_context_len)
        slots = (
            torch.tensor(pages, dtype=torch.int64)[:, None] * self.page_size
            + self._offsets[None, :]
        ).reshape(-1)
        self.table[row, start:end] = slots[: end - start]

    def slots(self, row: int, start: int, end: int) -> torch.Tensor:
        return self.table[row, start:end]
