"""RadixCache: a radix tree over token ids whose edges hold KV pages (SGLang's nouns and contract).

Used by the scheduler of a null or prefill worker. Units are whole pages: a key is cut to a multiple
of page_size, and node i's `pages[j]` holds tokens `key[j*ps:(j+1)*ps]`. Sizes are in tokens.
A node with lock_ref > 0 (some running request uses it or a descendant) is never evicted.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from sglang_ext.engine.kv_pool import PagePool


class TreeNode:
    __slots__ = ("children", "key", "last_access", "lock_ref", "pages", "parent")

    def __init__(self, key: list[int], pages: list[int], parent: TreeNode | None, now: float):
        self.key = key
        self.pages = pages
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = now


class MatchResult(NamedTuple):
    pages: list[int]  # pages of the matched prefix, in order
    last_node: TreeNode  # lock this (inc_lock_ref) to keep the prefix while it is used

    @property
    def num_pages(self) -> int:
        return len(self.pages)


def _common_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class RadixCache:
    def __init__(self, pool: PagePool, clock: Callable[[], float] = time.monotonic):
        self.pool = pool
        self.page_size = pool.page_size
        self._clock = clock
        self._tick = itertools.count()  # tie-breaker: equal clock readings keep insertion order
        self._new_tree()

    def _new_tree(self) -> None:
        self.root = TreeNode([], [], None, self._clock())
        self.root.lock_ref = 1  # the root is never evicted
        self._evictable = 0
        self._protected = 0

    def reset(self) -> None:
        """Drop the whole tree, returning every cached page to the pool (callers hold no locks)."""
        self.pool.free([p for n in self._nodes() for p in n.pages])
        self._new_tree()

    # --- queries ---------------------------------------------------------------------------------
    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def total_size(self) -> int:
        return self._evictable + self._protected

    def _page_key(self, key: Sequence[int], i: int) -> tuple[int, ...]:
        return tuple(key[i : i + self.page_size])

    def match_prefix(self, key: Sequence[int]) -> MatchResult:
        """The longest cached page-aligned prefix of `key`. Mutates: splits a node where the match
        ends inside it, and refreshes access times. Lock the returned node before relying on it."""
        ps = self.page_size
        key = key[: len(key) // ps * ps]
        node, i, pages, now = self.root, 0, [], self._clock()
        node.last_access = now
        while i < len(key):
            child = node.children.get(self._page_key(key, i))
            if child is None:
                break
            n = _common_len(child.key, key[i:]) // ps * ps
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            pages.extend(child.pages)
            node, i = child, i + n
        return MatchResult(pages, node)

    # --- mutations -------------------------------------------------------------------------------
    def insert(self, key: Sequence[int], pages: list[int]) -> int:
        """Add `key` (page-aligned, len(pages) pages) to the tree. Returns how many leading tokens
        were already cached: the caller's pages for that range (beyond those it got from
        match_prefix) are duplicates the caller must free. Pages after it now belong to the tree."""
        ps = self.page_size
        if len(key) != len(pages) * ps:
            raise ValueError(f"insert: {len(key)} tokens do not fill {len(pages)} pages of {ps}")
        node, i, now = self.root, 0, self._clock()
        while i < len(key):
            child = node.children.get(self._page_key(key, i))
            if child is None:
                new = TreeNode(list(key[i:]), pages[i // ps :], node, now)
                node.children[self._page_key(key, i)] = new
                self._evictable += len(new.key)
                return i
            n = _common_len(child.key, key[i:]) // ps * ps
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            node, i = child, i + n
        return i

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut `child` after n tokens; returns the new upper node (same locks, same access time)."""
        ps = self.page_size
        upper = TreeNode(child.key[:n], child.pages[: n // ps], child.parent, child.last_access)
        upper.lock_ref = child.lock_ref
        child.parent.children[self._page_key(upper.key, 0)] = upper
        child.key, child.pages, child.parent = child.key[n:], child.pages[n // ps :], upper
        upper.children[self._page_key(child.key, 0)] = child
        return upper

    def inc_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref <= 0:
                raise RuntimeError("dec_lock_ref on an unlocked node")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
            node = node.parent

    def evict(self, num_pages: int) -> int:
        """Free at least `num_pages` pages from unlocked leaves, least recently used first (whole
        nodes, so it may free more). Returns the number of pages freed."""
        heap = [
            (n.last_access, next(self._tick), n)
            for n in self._nodes()
            if not n.children and n.lock_ref == 0
        ]
        heapq.heapify(heap)
        freed = 0
        while freed < num_pages and heap:
            _, _, leaf = heapq.heappop(heap)
            self.pool.free(leaf.pages)
            freed += len(leaf.pages)
            self._evictable -= len(leaf.key)
            parent = leaf.parent
            del parent.children[self._page_key(leaf.key, 0)]
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, next(self._tick), parent))
        return freed

    # --- invariants ------------------------------------------------------------------------------
    def _nodes(self) -> list[TreeNode]:
        out, stack = [], list(self.root.children.values())
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    def cached_pages(self) -> list[int]:
        return [p for n in self._nodes() for p in n.pages]

    def check_integrity(self) -> None:
        """Raise AssertionError if the tree's bookkeeping is inconsistent (run from tests)."""
        ps, seen, evictable, protected = self.page_size, set(), 0, 0
        for n in self._nodes():
            assert n.key and len(n.key) == len(n.pages) * ps, "node key/pages mismatch"
            assert n.parent.children.get(self._page_key(n.key, 0)) is n, "child key mismatch"
            assert (
                0 <= n.lock_ref <= (n.parent.lock_ref if n.parent is not self.root else n.lock_ref)
            )
            for p in n.pages:
                assert p not in seen, f"page {p} cached twice"
                assert not self.pool._is_free[p], f"cached page {p} is also free"
                seen.add(p)
            if n.lock_ref:
                protected += len(n.key)
            else:
                evictable += len(n.key)
        assert (evictable, protected) == (self._evictable, self._protected), "size counters drift"
