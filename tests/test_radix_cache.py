"""RadixCache: prefix sharing, splits, lock refs, LRU eviction, integrity under random ops."""

import itertools
import random

from sglang_ext.engine.kv_pool import PagePool
from sglang_ext.engine.radix_cache import RadixCache


def make(num_pages=64, page_size=1):
    clock = itertools.count()
    pool = PagePool(num_pages, page_size)
    return pool, RadixCache(pool, clock=lambda: next(clock))


def put(cache, pool, key):
    """Insert like a finished request: match, allocate the rest, insert, free duplicates."""
    ps = pool.page_size
    key = key[: len(key) // ps * ps]
    m = cache.match_prefix(key)
    new = pool.alloc(len(key) // ps - m.num_pages)
    pages = m.pages + new
    done = cache.insert(key, pages)
    pool.free(pages[m.num_pages : done // ps])
    return pages


def test_match_shares_prefix_and_splits():
    pool, cache = make()
    a = put(cache, pool, [1, 2, 3, 4, 5])
    assert cache.total_size() == 5
    m = cache.match_prefix([1, 2, 3, 9])
    assert m.pages == a[:3]  # split inside the node
    b = put(cache, pool, [1, 2, 3, 9, 9])
    assert b[:3] == a[:3] and cache.total_size() == 7
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).pages == a
    assert cache.match_prefix([7]).pages == []
    cache.check_integrity()


def test_insert_reports_duplicates():
    pool, cache = make()
    cache.insert([1, 2, 3], pool.alloc(3))
    dup = pool.alloc(4)
    assert cache.insert([1, 2, 3, 4], dup) == 3  # first 3 pages are copies the caller frees
    pool.free(dup[:3])
    assert cache.total_size() == 4 and pool.num_free == 60
    cache.check_integrity()


def test_page_alignment():
    pool, cache = make(num_pages=16, page_size=4)
    pages = put(cache, pool, list(range(10)))  # 2 whole pages cached, the tail dropped
    assert len(pages) == 2 and cache.total_size() == 8
    m = cache.match_prefix(list(range(7)) + [99, 99])
    assert m.pages == pages[:1]  # mismatch inside page 2: only whole pages match
    cache.check_integrity()


def test_locked_nodes_survive_eviction_and_lru_order():
    pool, cache = make(num_pages=8)
    put(cache, pool, [1, 1])
    put(cache, pool, [2, 2])
    put(cache, pool, [3, 3])
    locked = cache.match_prefix([1, 1])
    cache.inc_lock_ref(locked.last_node)
    assert cache.protected_size() == 2 and cache.evictable_size() == 4
    cache.match_prefix([2, 2])  # touch: [3, 3] is now least recently used
    assert cache.evict(2) == 2
    assert cache.match_prefix([3, 3]).pages == [] and cache.match_prefix([2, 2]).num_pages == 2
    assert cache.evict(100) == 2  # only [2, 2] is left to evict
    assert cache.match_prefix([1, 1]).num_pages == 2
    cache.dec_lock_ref(locked.last_node)
    assert cache.evictable_size() == 2 and cache.evict(100) == 2
    assert pool.num_free == 8
    cache.check_integrity()


def test_evict_frees_parent_after_children():
    pool, cache = make()
    put(cache, pool, [1, 2, 3])
    put(cache, pool, [1, 2, 4])
    assert cache.evict(64) == 4 and cache.total_size() == 0 and pool.num_free == 64


def test_reset_returns_pages():
    pool, cache = make()
    put(cache, pool, [5, 6, 7])
    cache.reset()
    assert pool.num_free == 64 and cache.total_size() == 0


def test_random_ops_keep_integrity():
    rng = random.Random(0)
    for page_size in (1, 2, 4):
        pool, cache = make(num_pages=96, page_size=page_size)
        held = []  # (last_node, private pages) of "running requests"
        for _ in range(400):
            op = rng.random()
            if op < 0.5:
                key = [rng.randrange(4) for _ in range(rng.randrange(1, 20))]
                m = cache.match_prefix(key)
                cache.inc_lock_ref(m.last_node)
                need = rng.randrange(0, 4)
                if pool.num_free < need:
                    cache.evict(need - pool.num_free)
                own = pool.alloc(min(need, pool.num_free))
                held.append((m, own, key))
            elif op < 0.85 and held:
                m, own, key = held.pop(rng.randrange(len(held)))
                pages = m.pages + own
                k = (key + [9] * 100)[: len(pages) * page_size]
                done = cache.insert(k, pages)
                pool.free(pages[m.num_pages : max(m.num_pages, done // page_size)])
                cache.dec_lock_ref(m.last_node)
            else:
                cache.evict(rng.randrange(1, 8))
            cache.check_integrity()
            private = sum(len(o) for _, o, _ in held)
            cached = cache.total_size() // page_size
            assert pool.num_free + cached + private == pool.num_pages
        for m, own, _ in held:
            cache.dec_lock_ref(m.last_node)
            pool.free(own)
        cache.evict(10**6)
        assert pool.num_free == pool.num_pages
