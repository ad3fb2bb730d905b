"""page_ranges / match_ranges on small tensors (no NIXL)."""

import ctypes

import pytest
import torch

from sglang_ext.disagg.ranges import check_ranges_within, match_ranges, page_ranges, page_runs

L, S, H, D, PS = 3, 16, 2, 4, 4  # 4 pages of 4 slots


def kv(fill: str = "arange") -> torch.Tensor:
    shape = (L, 2, S, H, D)
    if fill == "zeros":
        return torch.zeros(shape)
    return torch.arange(L * 2 * S * H * D, dtype=torch.float32).reshape(shape)


def read(ranges: list[tuple[int, int]]) -> bytes:
    return b"".join(ctypes.string_at(a, n) for a, n in ranges)


def test_page_runs_merges_only_ascending_neighbours():
    assert page_runs([3, 4, 5, 1, 2, 7, 6]) == [(3, 3), (1, 2), (7, 1), (6, 1)]
    assert page_runs([]) == []


def test_page_ranges_count_and_bytes():
    t = kv()
    row = H * D * 4
    ranges = page_ranges(t, [1, 2, 0], PS)
    assert len(ranges) == L * 2 * 2  # runs [1,2] and [0] for every (layer, k|v)
    assert ranges[0] == (t.data_ptr() + 1 * PS * row, 2 * PS * row)
    # The bytes are the layer-major, K-then-V, token-order stream of those pages.
    slots = [4, 5, 6, 7, 8, 9, 10, 11, 0, 1, 2, 3]
    expected = torch.cat([t[layer, k, slots] for layer in range(L) for k in range(2)])
    assert read(ranges) == expected.numpy().tobytes()


def test_page_ranges_rejects_bad_input():
    with pytest.raises(ValueError, match="out of range"):
        page_ranges(kv(), [4], PS)
    with pytest.raises(ValueError, match="shaped"):
        page_ranges(torch.zeros(2, 3, 4), [0], 1)
    with pytest.raises(ValueError, match="contiguous"):
        page_ranges(kv().transpose(3, 4), [0], PS)


def test_match_ranges_pairs_differently_merged_sides():
    src_t, dst_t = kv(), kv("zeros")
    src = page_ranges(src_t, [0, 1, 2], PS)  # one run per plane
    dst = page_ranges(dst_t, [3, 1, 2], PS)  # two runs per plane
    s, d = match_ranges(src, dst)
    assert len(s) == len(d) == L * 2 * 2
    assert all(a[1] == b[1] for a, b in zip(s, d))
    for (sa, n), (da, _) in zip(s, d):
        ctypes.memmove(da, sa, n)
    for src_page, dst_page in [(0, 3), (1, 1), (2, 2)]:
        sl, dl = (
            slice(src_page * PS, (src_page + 1) * PS),
            slice(dst_page * PS, (dst_page + 1) * PS),
        )
        assert torch.equal(dst_t[:, :, dl], src_t[:, :, sl])
    assert torch.count_nonzero(dst_t[:, :, 0:PS]) == 0  # page 0 of decode untouched


def test_match_ranges_refuses_different_totals():
    t = kv()
    with pytest.raises(ValueError, match="same number of pages"):
        match_ranges(page_ranges(t, [0, 1], PS), page_ranges(t, [0], PS))


def test_check_ranges_within():
    t = kv()
    check_ranges_within(page_ranges(t, [3], PS), t, "src")
    with pytest.raises(ValueError, match="outside"):
        check_ranges_within([(t.data_ptr() - 8, 16)], t, "src")
    with pytest.raises(ValueError, match="empty"):
        check_ranges_within([], t, "src")
