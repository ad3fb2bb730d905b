"""Fig. 4(iii), second-layer aggregator latency on random-token prompts for incremental prefill
vs plain PD vs two data-parallel replicas (± chunked prefill). Brings up its own deployment (the
reference engine, or real SGLang with --backend sglang: on GPUs, or on SGLang's CPU path without
one), writes D/microbench.jsonl and fig_microbench.png (`moa-pd plot D` redraws it).

    python -m benchmarks.microbench --out D [--backend sglang] [--variants incremental,pd]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import aiohttp

from launch.signals import sigterm_as_ctrl_c
from sglang_ext import protocol as P

VARIANTS = ("incremental", "pd", "dp2", "dp2_chunked")
ROW_KEYS = ("variant", "prompt_tokens", "latency_s", "ttft_s", "cached_tokens")
# Random prompt ids start above the special tokens of SmolLM2/Llama tokenizers (ids < 100).
LOW_TOKEN_ID = 100


class BenchError(RuntimeError):
    """A request of the benchmark failed; the message names the URL and the answer."""


# --- pure parts (unit-tested in tests/test_microbench.py) -----------------------------------------
def sample_prompts(n: int, max_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    """n prompts of random token ids, lengths L ~ U(1, max_len) (inclusive)."""
    if n < 1 or max_len < 1 or vocab_size <= LOW_TOKEN_ID:
        raise ValueError(
            f"need --num-prompts >= 1, --max-len >= 1 and a vocabulary above {LOW_TOKEN_ID} tokens"
        )
    rng = random.Random(seed)
    lengths = [rng.randint(1, max_len) for _ in range(n)]
    return [[rng.randrange(LOW_TOKEN_ID, vocab_size) for _ in range(n_tok)] for n_tok in lengths]


def warm_prefix_lengths(prompt_len: int, chunk: int) -> list[int]:
    """Prefix lengths the warm-ups carry: one per `chunk` tokens that arrived before the final
    request (the router's "fixed" chunk policy). The tail after the last full chunk is what the
    final request still prefills; a prompt of at most `chunk` tokens gets no warm-up."""
    if chunk < 1:
        raise ValueError("--warm-chunk must be >= 1")
    return list(range(chunk, prompt_len, chunk))


def make_row(
    variant: str,
    prompt_tokens: int,
    latency_s: float,
    ttft_s: float | None,
    cached_tokens: int,
    prompt_index: int,
) -> dict:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; use one of {VARIANTS}")
    return {
        "variant": variant,
        "prompt_tokens": int(prompt_tokens),
        "latency_s": float(latency_s),
        "ttft_s": None if ttft_s is None else float(ttft_s),
        "cached_tokens": int(cached_tokens),
        "prompt_index": prompt_index,
    }


def normalized_medians(rows: list[dict]) -> list[dict]:
    """Per variant: median latency / TTFT, that median ÷ plain PD's, and the median of the
    per-prompt ratios to PD (robust to the spread of prompt lengths)."""
    by_variant: dict[str, list[dict]] = {}
    for r in rows:
        by_variant.setdefault(r["variant"], []).append(r)
    if "pd" not in by_variant:
        raise ValueError("no 'pd' rows: plain PD is the normalization base")
    pd_med = statistics.median(r["latency_s"] for r in by_variant["pd"])
    pd_by_prompt = {r["prompt_index"]: r["latency_s"] for r in by_variant["pd"]}
    out = []
    for v in [v for v in VARIANTS if v in by_variant]:
        lat = [r["latency_s"] for r in by_variant[v]]
        ttft = [r["ttft_s"] for r in by_variant[v] if r["ttft_s"] is not None]
        paired = [
            r["latency_s"] / pd_by_prompt[r["prompt_index"]]
            for r in by_variant[v]
            if pd_by_prompt.get(r["prompt_index"])
        ]
        out.append(
            {
                "variant": v,
                "n": len(lat),
                "median_latency_s": statistics.median(lat),
                "median_ttft_s": statistics.median(ttft) if ttft else None,
                "vs_pd": statistics.median(lat) / pd_med if pd_med > 0 else float("nan"),
                "paired_vs_pd": statistics.median(paired) if paired else float("nan"),
                "mean_cached_tokens": statistics.fmean(r["cached_tokens"] for r in by_variant[v]),
            }
        )
    return out


def format_table(summary: list[dict]) -> str:
    lines = [
        (
            "| variant | n | median latency (s) | median TTFT (s) | ÷ PD (medians) | "
            "median per-prompt ÷ PD | mean cached tokens |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        ttft = f"{s['median_ttft_s']:.3f}" if s["median_ttft_s"] is not None else "-"
        lines.append(
            f"| {s['variant']} | {s['n']} | {s['median_latency_s']:.3f} | {ttft} | "
            f"{s['vs_pd']:.3f} | {s['paired_vs_pd']:.3f} | "
            f"{s['mean_cached_tokens']:.0f} |"
        )
    return "\n".join(lines)


# --- HTTP ------------------------------------------------------------------------------------------
@dataclass(slots=True)
class GenResult:
    latency_s: float
    ttft_s: float | None
    meta: dict = field(default_factory=dict)


async def stream_generate(session: aiohttp.ClientSession, url: str, body: dict) -> GenResult:
    """POST a streamed /generate; clock from send to the last chunk, TTFT at the first token."""
    t0 = time.perf_counter()
    ttft, meta = None, {}
    async with session.post(f"{url}/generate", json={**body, P.STREAM: True}) as resp:
        if resp.status != 200:
            raise BenchError(f"{url}/generate answered {resp.status}: {(await resp.text())[:300]}")
        async for raw in resp.content:
            chunk = P.parse_sse_line(raw.decode(errors="replace"))
            if chunk is None:
                continue
            if ttft is None and chunk.get(P.OUTPUT_IDS):
                ttft = time.perf_counter() - t0
            meta = chunk.get(P.META_INFO, meta)
    latency = time.perf_counter() - t0
    finish = meta.get(P.FINISH_REASON) or {}
    if not meta or (isinstance(finish, dict) and finish.get("type") == P.FINISH_ABORT):
        raise BenchError(f"{url}/generate ended without a normal finish: {finish or 'no meta'}")
    return GenResult(latency, ttft, meta)


async def post_json(session: aiohttp.ClientSession, url: str, body: dict | None = None) -> dict:
    async with session.post(url, json=body or {}) as resp:
        text = await resp.text()
        if resp.status != 200:
            raise BenchError(f"{url} answered {resp.status}: {text[:300]}")
        try:
            return json.loads(text)
        except ValueError:
            return {"text": text}


async def flush(session: aiohttp.ClientSession, url: str, timeout_s: float = 30.0) -> None:
    """POST /flush_cache until it succeeds: a worker refuses while a request is still live (a PD
    prefill releases its request only after the KV transfer is acknowledged)."""
    deadline = time.monotonic() + timeout_s
    while True:
        async with session.post(f"{url}/flush_cache") as resp:
            text = await resp.text()
            if resp.status == 200:
                return
        if time.monotonic() > deadline:
            raise BenchError(f"{url}/flush_cache kept failing ({resp.status}): {text[:200]}")
        await asyncio.sleep(0.1)


def generate_body(prompt: list[int], output_len: int) -> dict:
    return {
        P.INPUT_IDS: prompt,
        P.SAMPLING_PARAMS: {P.MAX_NEW_TOKENS: output_len, P.TEMPERATURE: 0.0, P.IGNORE_EOS: True},
    }


# --- the run ---------------------------------------------------------------------------------------
async def measure(
    session: aiohttp.ClientSession,
    dep,
    variant: str,
    i: int,
    prompt: list[int],
    output_len: int,
    warm_chunk: int,
) -> dict:
    """One prompt through one variant, after flushing every radix cache."""
    for url in dep.cache_urls:
        await flush(session, url)
    if variant == "incremental":
        # The precursors' decode time: warm-ups run before the clock starts.
        for n in warm_prefix_lengths(len(prompt), warm_chunk):
            await post_json(
                session, dep.prefill_url + P.PREFILL_ONLY_PATH, {P.INPUT_IDS: prompt[:n]}
            )
    url = {
        "incremental": dep.router_url,
        "pd": dep.router_url,
        "dp2": dep.dp_urls[i % 2] if dep.dp_urls else "",
        "dp2_chunked": dep.dp_chunked_urls[i % 2] if dep.dp_chunked_urls else "",
    }[variant]
    res = await stream_generate(session, url, generate_body(prompt, output_len))
    return make_row(
        variant, len(prompt), res.latency_s, res.ttft_s, int(res.meta.get(P.CACHED_TOKENS, 0)), i
    )


async def run_prompts(
    dep,
    prompts: list[list[int]],
    variants: list[str],
    output_len: int,
    warm_chunk: int,
    out: TextIO,
) -> list[dict]:
    """Every prompt through every variant; each row is appended to `out` as it is measured."""
    from tqdm import tqdm

    rows: list[dict] = []
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        # First requests on a fresh worker pay one-off costs (allocator, lazy init): not measured.
        for url in dep.urls:
            await stream_generate(session, url, generate_body(prompts[0][:8], 2))
        with tqdm(total=len(prompts) * len(variants), desc="microbench", unit="req") as bar:
            for i, prompt in enumerate(prompts):
                for variant in variants:  # interleaved: A B C D, A B C D, ...
                    row = await measure(session, dep, variant, i, prompt, output_len, warm_chunk)
                    rows.append(row)
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    bar.set_postfix(L=row["prompt_tokens"], v=variant, s=f"{row['latency_s']:.2f}")
                    bar.update()
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="folder for microbench.jsonl and the figure")
    p.add_argument(
        "--num-prompts",
        type=int,
        default=12,
        help="random prompts, each run through every variant (default 12, sized for "
        "a few minutes on 2 CPU cores)",
    )
    p.add_argument("--output-len", type=int, default=32, help="fixed output tokens (default 32)")
    p.add_argument(
        "--max-len",
        type=int,
        default=1024,
        help="prompt lengths L ~ U(1, max_len) (paper: 2048; default 1024 on CPU)",
    )
    p.add_argument(
        "--warm-chunk",
        type=int,
        default=128,
        help="incremental: one warm-up per this many arrived tokens (default 128)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--model-path",
        default="smollm2-135m",
        help="a local HF directory, 'smollm2-135m', or 'dummy:SHAPE' (e.g. dummy:qwen3-8b: random "
        "weights of that shape, see `moa-pd dummy-model`)",
    )
    p.add_argument(
        "--load-format",
        choices=["auto", "dummy"],
        default=None,
        help="SGLang's --load-format for every worker; 'dummy': random weights of the model's "
        "shape (default: dummy for a dummy:SHAPE model, else auto)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument(
        "--backend",
        choices=["torch", "sglang"],
        default="torch",
        help="the workers: the reference engine (default) or real SGLang (one GPU per "
        "worker, or SGLang's CPU path where there is no GPU; run from a venv "
        "with sglang, e.g. .venv-sglang)",
    )
    p.add_argument(
        "--variants",
        type=parse_variants,
        default=None,
        help=f"comma-separated, from {','.join(VARIANTS)}; must include pd (the "
        "baseline). Default: all for torch; incremental,pd for sglang without a "
        "GPU (each SGLang CPU worker holds ≈3.7 GB; dp2 adds two, dp2_chunked "
        "two more)",
    )


def parse_variants(text: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in names if v not in VARIANTS]
    if bad or "pd" not in names:
        raise argparse.ArgumentTypeError(
            f"{text!r}: name variants from {','.join(VARIANTS)}, including pd (the baseline "
            "the others are normalized to)"
        )
    return tuple(v for v in VARIANTS if v in names)


def default_variants(backend: str) -> tuple[str, ...]:
    from planning.gpus import has_nvidia_gpus

    if backend == "sglang" and not has_nvidia_gpus():
        return ("incremental", "pd")
    return VARIANTS


def main(args: argparse.Namespace) -> int:
    from benchmarks.microbench_deploy import Deployment, vocab_size
    from experiments.plot_cmd import rebuild
    from launch.procs import LaunchError

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.backend == "sglang" and importlib.util.find_spec("sglang") is None:
        print(
            "error: --backend sglang needs real SGLang in this venv; run it with "
            ".venv-sglang/bin/python (built by `make test-sglang`) or install '.[sglang]' on a "
            "GPU node",
            file=sys.stderr,
        )
        return 2
    selected = args.variants or default_variants(args.backend)
    try:
        prompts = sample_prompts(
            args.num_prompts, args.max_len, vocab_size(args.model_path), args.seed
        )
        with Deployment(
            args.model_path,
            args.host,
            args.max_len + args.output_len,
            out / "logs",
            backend=args.backend,
            variants=selected,
            load_format=args.load_format,
        ) as dep:
            variants = [v for v in selected if v != "dp2_chunked" or dep.dp_chunked_urls]
            with open(out / "microbench.jsonl", "w") as sink:
                rows = asyncio.run(
                    run_prompts(dep, prompts, variants, args.output_len, args.warm_chunk, sink)
                )
    except (ValueError, LaunchError, BenchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ValueError) else 1
    except KeyboardInterrupt:
        print(
            f"interrupted; rows measured so far are in {out / 'microbench.jsonl'}", file=sys.stderr
        )
        return 130
    print(format_table(normalized_medians(rows)))
    for path in rebuild(out, print_table=False):
        print(f"wrote {path}")
    return 0


def cli(argv: list[str] | None = None) -> int:
    """`python -m benchmarks.microbench`, with the flags it had as `moa-pd microbench`. As under
    `moa-pd`, SIGTERM (`timeout`, the end of a job) stops it the way Ctrl-C does, so its workers
    are stopped, not left running."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.microbench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    sigterm_as_ctrl_c()
    return main(args)


if __name__ == "__main__":
    sys.exit(cli())
