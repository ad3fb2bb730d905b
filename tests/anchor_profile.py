"""A hand-made GPU profile from the measured anchor numbers of issue 22 (one H200, CUDA graphs;
../shared/reference/gpu-offline.md) for planner tests: Qwen3-8B and 32B shapes as measured, 4B
assumed at about half of 8B (no anchor for it). Weights and KV bytes per token are the shapes'."""

from __future__ import annotations

from profiling.profile_file import DecodePoint, DeviceInfo, ModelProfile, PrefillPoint, Profile

GIB = 1 << 30
# (prefill s at 1,024 and 4,096 tokens; decode s/step at batch 1 and 9; weights; KV bytes/token)
ANCHORS = {
    "qwen3-4b": ((0.016, 0.062), (0.0040, 0.0046), 8_045_000_000, 2 * 36 * 8 * 128 * 2),
    "qwen3-8b": ((0.029, 0.118), (0.0058, 0.0066), 16_381_000_000, 2 * 36 * 8 * 128 * 2),
    "qwen3-32b": ((0.116, 0.483), (0.0195, 0.0206), 65_524_000_000, 2 * 64 * 8 * 128 * 2),
}


def model_profile(prefill, decode, weights, kv, pd_fixed=0.02) -> ModelProfile:
    return ModelProfile(
        model_path="dummy",
        weights_bytes=weights,
        kv_bytes_per_token=kv,
        prefill=[
            PrefillPoint(new_tokens=1024, seconds=prefill[0]),
            PrefillPoint(new_tokens=4096, seconds=prefill[1]),
        ],
        decode=[
            DecodePoint(batch=1, context=1024, step_seconds=decode[0]),
            DecodePoint(batch=9, context=1024, step_seconds=decode[1]),
        ],
        pd_fixed_seconds=pd_fixed,
    )


def anchor_profile(models: dict[str, str] | None = None) -> Profile:
    """The anchors, under the config's model names (models: config name -> anchor name)."""
    models = models or {m: m for m in ANCHORS}
    return Profile(
        device=DeviceInfo(kind="cuda", name="NVIDIA H200", memory_mib=141 * 1024),
        backend="sglang",
        versions={"note": "issue 22 anchor numbers, hand-made"},
        created="2026-11-26T00:00:00Z",
        models={name: model_profile(*ANCHORS[a]) for name, a in models.items()},
    )
