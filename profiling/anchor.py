"""GPU anchor profiles of the Qwen3 shapes, built from numbers measured on an H200 and an H100
(docs in ../shared/reference/gpu-offline.md, issue 22), for simulating and planning GPU
deployments where no GPU is lent. Every number is either measured (copied here as published) or
derived by a rule written out below; each model's `notes` says which is which.

    python -m profiling.anchor --out-dir profiling/anchors
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from profiling.machine import now_utc
from profiling.profile_file import DecodePoint, DeviceInfo, ModelProfile, PrefillPoint, Profile

MS = 1e-3
PREFILL_LENGTHS = (256, 1024, 2048, 4096)
# The physical anchor (plain torch, random bf16 weights, eager SDPA prefill at batch 1, decode
# one step replayed in a CUDA graph at context 1,024): {card: {shape: (prefill ms per
# PREFILL_LENGTHS, {batch: decode ms/step})}}.
MEASURED = {
    "h200": {
        "qwen3-4b": ((17.7, 18.1, 34.3, 69.8), {1: 3.95, 3: 4.26, 9: 4.58}),
        "qwen3-8b": ((11.5, 29.0, 57.0, 118.2), {1: 5.79, 3: 6.10, 9: 6.55}),
        "qwen3-32b": ((42.6, 116.3, 233.2, 483.0), {1: 19.5, 3: 20.1, 9: 20.6}),
    },
    "h100": {
        "qwen3-4b": ((10.2, 18.2, 35.3, 70.7), {1: 4.67, 3: 4.98, 9: 5.39, 32: 7.21}),
        "qwen3-8b": ((11.5, 29.2, 57.7, 118.0), {1: 7.24, 3: 7.62, 9: 8.13, 32: 9.62}),
        "qwen3-32b": ((38.7, 118.4, 234.2, 484.5), {1: 25.0, 3: 26.0, 9: 26.8, 32: 30.0}),
    },
}
MEASURED_CONTEXT = 1024
CARDS = {
    # name, memory MiB (nvidia-smi), HBM bandwidth bytes/s (published spec, used to derive the
    # KV-read cost of longer contexts)
    "h200": ("NVIDIA H200", 143771, 4.8e12),
    "h100": ("NVIDIA H100 80GB HBM3", 81559, 3.35e12),
}
# TTFT through the PD router, 1,500-token prompt, 8B shape, H200, SGLang 0.5.17: 53.9 ms cold
# (median of 3). Minus the anchor's 8B prefill at 1,500 tokens (interpolated) = the PD path's
# fixed cost; the only such measurement, so every shape and card gets it.
TTFT_8B_H200_1500_S = 53.9 * MS
# Shapes no GPU measured, scaled from a measured one by parameter count.
SCALED = {"qwen3-1.7b": "qwen3-4b"}
DERIVED_CONTEXT = 4096
SOURCE = "../shared/reference/gpu-offline.md ('Physical anchor') and issue 22"


def memory(shape: str):
    """Weights and KV bytes/token of the dummy shape (bf16), as planning computes them."""
    from planning.model_memory import model_memory
    from sglang_ext.engine.model_store import resolve_model_path

    return model_memory(resolve_model_path(f"dummy:{shape}"), "bfloat16")


def interpolate(lengths: tuple[int, ...], seconds: list[float], n: int) -> float:
    return float(np.interp(n, lengths, seconds))


def cold_intercept(lengths: tuple[int, ...], seconds: list[float]) -> float:
    """The fixed part of a prefill: intercept of the non-negative linear fit of the cold points."""
    from scipy.optimize import nnls

    x = np.array([[1.0, n] for n in lengths])
    return float(nnls(x, np.array(seconds))[0][0])


def prefill_points(seconds: list[float]) -> list[PrefillPoint]:
    """The measured cold points, and cached ones derived from them: N new tokens after P cached
    cost what extending a cold P-token prefill to P + N costs (cold(P+N) - cold(P)), plus the
    fixed part one request pays (cold fit's intercept)."""
    pts = [PrefillPoint(new_tokens=n, seconds=s) for n, s in zip(PREFILL_LENGTHS, seconds)]
    fixed = cold_intercept(PREFILL_LENGTHS, seconds)
    for p, n in ((1024, 1024), (2048, 2048), (1024, 3072)):
        s = interpolate(PREFILL_LENGTHS, seconds, p + n) - interpolate(PREFILL_LENGTHS, seconds, p)
        pts.append(PrefillPoint(new_tokens=n, cached_tokens=p, seconds=max(s, 0.0) + fixed))
    return pts


def decode_points(ms: dict[int, float], kv_bytes: int, bandwidth: float) -> list[DecodePoint]:
    """The measured points at context 1,024, and each batch again at 4,096: plus the time to
    read the extra KV of every sequence once per step at the card's HBM bandwidth."""
    pts = [
        DecodePoint(batch=b, context=MEASURED_CONTEXT, step_seconds=v * MS) for b, v in ms.items()
    ]
    extra = DERIVED_CONTEXT - MEASURED_CONTEXT
    pts += [
        DecodePoint(
            batch=b, context=DERIVED_CONTEXT, step_seconds=v * MS + b * extra * kv_bytes / bandwidth
        )
        for b, v in ms.items()
    ]
    return pts


def pd_fixed_seconds() -> float:
    prefill_8b = [v * MS for v in MEASURED["h200"]["qwen3-8b"][0]]
    return max(0.0, TTFT_8B_H200_1500_S - interpolate(PREFILL_LENGTHS, prefill_8b, 1500))


def model_profile(card: str, shape: str) -> ModelProfile:
    base = SCALED.get(shape, shape)
    prefill_ms, decode_ms = MEASURED[card][base]
    mem = memory(shape)
    scale = 1.0
    scaled = ""
    if base != shape:
        scale = mem.parameters / memory(base).parameters
        scaled = (
            f"DERIVED: every time is {base}'s measured one x {scale:.3f} (parameter count "
            f"{mem.parameters:,} / {memory(base).parameters:,}); "
        )
    bandwidth = CARDS[card][2]
    notes = (
        f"{scaled}source {SOURCE}. MEASURED on {CARDS[card][0]}: cold prefill at "
        f"{'/'.join(map(str, PREFILL_LENGTHS))} tokens, decode ms/step at batch "
        f"{'/'.join(map(str, decode_ms))}, context {MEASURED_CONTEXT} (plain torch, random bf16 "
        "weights, CUDA graph decode). DERIVED: cached-prefix prefill points (N after P cached = "
        "cold(P+N) - cold(P) + the cold fit's intercept); decode at context "
        f"{DERIVED_CONTEXT} (+ batch x {DERIVED_CONTEXT - MEASURED_CONTEXT} tokens x KV "
        f"bytes/token / {bandwidth / 1e12:g} TB/s HBM); pd_fixed_seconds = the H200 8B TTFT "
        "through the PD router at 1,500 tokens (53.9 ms, SGLang 0.5.17, median of 3) minus the "
        "8B anchor prefill at 1,500 (interpolated), used for every shape and card (measured "
        "nowhere else); weights and KV bytes from the dummy shape's config.json "
        "(planning/model_memory.py, bf16)."
    )
    return ModelProfile(
        model_path=f"dummy:{shape}",
        weights_bytes=mem.weights_bytes,
        kv_bytes_per_token=mem.kv_bytes_per_token,
        prefill=prefill_points([v * MS * scale for v in prefill_ms]),
        decode=decode_points(
            {b: v * scale for b, v in decode_ms.items()}, mem.kv_bytes_per_token, bandwidth
        ),
        pd_fixed_seconds=pd_fixed_seconds(),
        notes=notes,
    )


def anchor_profile(card: str) -> Profile:
    name, memory_mib, _ = CARDS[card]
    shapes = [*MEASURED[card], *SCALED]
    return Profile(
        device=DeviceInfo(kind="cuda", name=name, count=1, memory_mib=memory_mib),
        backend="sglang",
        versions={"source": "physical anchor: plain torch (bf16), not SGLang; see notes"},
        created=now_utc(),
        host="gpu-anchor",
        models={shape: model_profile(card, shape) for shape in sorted(shapes)},
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m profiling.anchor", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--out-dir", default=str(Path(__file__).parent / "anchors"))
    a = p.parse_args(argv)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for card in CARDS:
        path = out / f"gpu_anchor_qwen3_{card}.json"
        anchor_profile(card).dump(path)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
