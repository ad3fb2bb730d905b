"""PagePool and ReqToTokenPool: allocation, double free, slot mapping."""

import pytest

from sglang_ext.engine.kv_pool import OutOfPagesError, PagePool, ReqToTokenPool


def test_alloc_free_roundtrip():
    pool = PagePool(8, page_size=4)
    a = pool.alloc(3)
    assert a == [0, 1, 2] and pool.num_free == 5
    b = pool.alloc(5)
    assert sorted(a + b) == list(range(8)) and pool.num_free == 0
    assert not pool.can_alloc(1)
    with pytest.raises(OutOfPagesError):
        pool.alloc(1)
    pool.free(a)
    assert pool.num_free == 3 and pool.can_alloc(3)


def test_double_free_is_an_error():
    pool = PagePool(4, page_size=1)
    pages = pool.alloc(2)
    pool.free(pages)
    with pytest.raises(RuntimeError, match="double free"):
        pool.free(pages[:1])


def test_pages_for_rounds_up():
    pool = PagePool(4, page_size=4)
    assert [pool.pages_for(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_req_to_token_slots():
    table = ReqToTokenPool(num_rows=2, max_context_len=16, page_size=4)
    row = table.alloc()
    table.write_pages(row, 0, [3, 1])
    table.write_pages(row, 2, [0])
    assert table.slots(row, 0, 10).tolist() == [12, 13, 14, 15, 4, 5, 6, 7, 0, 1]
    other = table.alloc()
    assert other != row and table.alloc() is None
    table.free(row)
    assert table.num_free == 1


def test_a_freed_run_is_handed_out_again_in_ascending_order():
    """A KV transfer merges consecutive pages into one range: a LIFO that handed a freed run out
    backwards made every page a range of its own on every second request."""
    from sglang_ext.disagg.ranges import page_runs

    pool = PagePool(64, page_size=1)
    for _ in range(3):
        pages = pool.alloc(40)
        assert page_runs(pages) == [(pages[0], 40)]
        pool.free(pages)
    a, b = pool.alloc(10), pool.alloc(10)
    pool.free(a)
    pool.free(b)
    # Runs freed one after another come back as runs (b's first, then a's).
    assert page_runs(pool.alloc(20)) == [(b[0], 10), (a[0], 10)]
