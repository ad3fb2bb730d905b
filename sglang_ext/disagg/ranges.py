"""Byte ranges of KV pages in a KV pool tensor, and the pairing of source with destination ranges.

The engine calls `page_ranges` on both workers; the KV transfer pairs the two lists with
`match_ranges`, so each side may merge its own runs of consecutive pages independently.
"""

from __future__ import annotations

import numpy as np
import torch

Range = tuple[int, int]  # (address, nbytes)


def kv_row_bytes(kv_buffer: torch.Tensor) -> int:
    """Bytes of one slot of one layer's K (or V): kv_heads * head_dim * element size."""
    check_kv_buffer(kv_buffer)
    return kv_buffer.shape[3] * kv_buffer.shape[4] * kv_buffer.element_size()


def check_kv_buffer(kv_buffer: torch.Tensor) -> None:
    if kv_buffer.dim() != 5 or kv_buffer.shape[1] != 2:
        raise ValueError(
            f"kv_buffer must be shaped [num_layers, 2, num_slots, kv_heads, head_dim], "
            f"got {tuple(kv_buffer.shape)}"
        )
    if kv_buffer.device.type != "cpu" or not kv_buffer.is_contiguous():
        raise ValueError("kv_buffer must be one contiguous CPU tensor (it is registered as DRAM)")


def page_runs(page_ids: list[int]) -> list[tuple[int, int]]:
    """Runs of consecutive page ids as (first page, count), in the given order."""
    runs: list[tuple[int, int]] = []
    for p in page_ids:
        if runs and runs[-1][0] + runs[-1][1] == p:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((p, 1))
    return runs


def page_ranges(kv_buffer: torch.Tensor, page_ids: list[int], page_size: int) -> list[Range]:
    """(addr, nbytes) of every page, for each layer then K/V, runs of consecutive ids merged.

    Order: layer 0 K pages, layer 0 V pages, layer 1 K pages, ...; within each, the pages in the
    order given (token order). Two workers that list a request's pages in token order therefore
    produce the same byte stream, whatever their page ids.
    """
    row = kv_row_bytes(kv_buffer)
    num_layers, _, num_slots = kv_buffer.shape[:3]
    num_pages = num_slots // page_size
    bad = [p for p in page_ids if not 0 <= p < num_pages]
    if bad:
        raise ValueError(f"page ids {bad[:5]} out of range: the pool has {num_pages} pages")
    runs = page_runs(page_ids)
    page_bytes = page_size * row
    base = kv_buffer.data_ptr()
    out: list[Range] = []
    for layer_kv in range(num_layers * 2):  # (layer, k|v) in memory order
        plane = base + layer_kv * num_slots * row
        out.extend((plane + first * page_bytes, count * page_bytes) for first, count in runs)
    return out


def check_ranges_within(ranges: list[Range], kv_buffer: torch.Tensor, side: str) -> None:
    """Raise ValueError unless every range lies inside kv_buffer."""
    if not ranges:
        raise ValueError(f"{side} ranges are empty: a request has at least one KV page")
    arr = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
    lo, hi = (
        kv_buffer.data_ptr(),
        kv_buffer.data_ptr() + kv_buffer.numel() * kv_buffer.element_size(),
    )
    if (arr[:, 1] <= 0).any() or arr[:, 0].min() < lo or (arr[:, 0] + arr[:, 1]).max() > hi:
        raise ValueError(f"{side} ranges reach outside the registered KV buffer [{lo:#x}, {hi:#x})")


def match_ranges(src: list[Range], dst: list[Range]) -> tuple[list[Range], list[Range]]:
    """Split both lists at each other's boundaries so that they pair one to one.

    Both describe the same byte stream (same total length, same order); only the places where
    each side could merge pages differ. Raises ValueError when the totals differ.
    """
    total_src, total_dst = sum(n for _, n in src), sum(n for _, n in dst)
    if total_src != total_dst:
        raise ValueError(
            f"prefill sends {total_src} bytes but decode reserved {total_dst} bytes: "
            "both sides must list the same number of pages of the same KV shape"
        )
    if len(src) == len(dst) and all(a[1] == b[1] for a, b in zip(src, dst)):
        return list(src), list(dst)
    out_src: list[Range] = []
    out_dst: list[Range] = []
    i = j = 0
    si, sn = src[0]
    di, dn = dst[0]
    while True:
        step = min(sn, dn)
        out_src.append((si, step))
        out_dst.append((di, step))
        si, sn, di, dn = si + step, sn - step, di + step, dn - step
        if sn == 0:
            i += 1
            if i == len(src):
                break
            si, sn = src[i]
        if dn == 0:
            j += 1
            di, dn = dst[j]
    return out_src, out_dst
