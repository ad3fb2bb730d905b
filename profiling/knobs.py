"""What `moa-pd profile` measures: prompt lengths, cached prefixes, decode batches and contexts,
repetitions. GPU-sized defaults for real SGLang on CUDA, CPU-sized ones otherwise."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class Knobs:
    prompt_lengths: tuple[int, ...]  # cold prefills (nothing cached), and the PD path's TTFT
    cached_prefixes: tuple[int, ...]  # prefix P warmed first, then P + cached_new_tokens sent
    cached_new_tokens: int
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]  # prompt tokens of each decoding sequence
    decode_tokens: int  # decode steps a decode point times (the difference of two runs)
    reps: int  # repetitions of each prefill and TTFT point (medians)

    @property
    def max_context(self) -> int:
        return max(
            max(self.prompt_lengths),
            max(self.cached_prefixes, default=0) + self.cached_new_tokens,
            max(self.decode_contexts),
        )


# Prompts up to 4,096 tokens and batches up to 32 (issue 22); ~2.5 min for an 8B shape on an
# H200. Decode contexts stop at 2,048: 32 streams of 4,096 would need a ~150k-token pool per
# worker (~21 GiB for 8B), which with both 8B workers on one H100 does not fit.
GPU_KNOBS = Knobs(
    prompt_lengths=(256, 1024, 2048, 4096),
    cached_prefixes=(1024, 3072),
    cached_new_tokens=256,
    decode_batches=(1, 8, 32),
    decode_contexts=(512, 2048),
    decode_tokens=128,
    reps=5,
)
# The CPU configs' models (SmolLM2-135M, Gemma-3-270M) on 2 shared cores, where a 512-token
# Gemma-3 prefill takes 1-4 s and a decode step 0.1-0.7 s (by load): ~1-2 min per model. The
# points reach what a deployment runs, since the fits do not extrapolate far: prompts of 1,024
# tokens and decode contexts of 512 (an aggregator's prompt holds three to nine answers,
# ~500-1,500 tokens), decode batches of 16 (the reference engine's default --max-running-requests;
# its step costs more per row there than the line through 1-8 rows predicts).
CPU_KNOBS = Knobs(
    prompt_lengths=(32, 128, 384, 1024),
    cached_prefixes=(96, 288),
    cached_new_tokens=32,
    decode_batches=(1, 4, 8, 16),
    decode_contexts=(32, 512),
    decode_tokens=16,
    reps=3,
)


def default_knobs(gpu: bool) -> Knobs:
    return GPU_KNOBS if gpu else CPU_KNOBS


def parse_ints(text: str, what: str, minimum: int = 1) -> tuple[int, ...]:
    """ "256,1024" -> (256, 1024); a clear argparse error otherwise."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{what}: {text!r} is not a comma-separated list of integers"
        ) from None
    if not values or min(values) < minimum:
        raise argparse.ArgumentTypeError(f"{what}: give integers >= {minimum}, e.g. 256,1024")
    return tuple(sorted(set(values)))


def add_knob_args(p: argparse.ArgumentParser) -> None:
    """The knobs as flags; each left out keeps the backend's default (GPU_KNOBS / CPU_KNOBS)."""

    def ints(flag: str, minimum: int = 1):
        return lambda t: parse_ints(t, flag, minimum)

    g = p.add_argument_group("what to measure (defaults: GPU-sized for sglang on CUDA, else CPU)")
    g.add_argument("--prompt-lengths", type=ints("--prompt-lengths"), help="cold prefill lengths")
    g.add_argument(
        "--cached-prefixes", type=ints("--cached-prefixes"), help="cached prefix lengths P"
    )
    g.add_argument("--cached-new-tokens", type=int, help="new tokens N sent after a cached P")
    g.add_argument("--decode-batches", type=ints("--decode-batches"), help="concurrent streams")
    g.add_argument(
        "--decode-contexts", type=ints("--decode-contexts"), help="decode prompt lengths"
    )
    g.add_argument("--decode-tokens", type=int, help="decode steps timed per decode point")
    g.add_argument("--reps", type=int, help="repetitions per prefill and TTFT point")


def knobs_from_args(args: argparse.Namespace, gpu: bool) -> Knobs:
    """The defaults for the device with every given flag applied; ValueError for a bad value."""
    knobs = default_knobs(gpu)
    given = {
        f: getattr(args, f)
        for f in Knobs.__dataclass_fields__
        if getattr(args, f, None) is not None
    }
    knobs = replace(knobs, **given)
    for name in ("cached_new_tokens", "decode_tokens", "reps"):
        if getattr(knobs, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if len(knobs.prompt_lengths) + len(knobs.cached_prefixes) < 2:
        raise ValueError("give at least two prefill points (--prompt-lengths, --cached-prefixes)")
    if len(knobs.decode_batches) * len(knobs.decode_contexts) < 2:
        raise ValueError("give at least two decode points (--decode-batches × --decode-contexts)")
    return knobs
