"""The reference engine against real SGLang's CPU path (issue 12), SmolLM2-135M fp32, one run.

Both servers are up side by side (one `--disaggregation-mode null` worker each, started by the
same launch code as `moa-pd up`, SGLang with the CPU flags of sglang_backend/cpu.py); each
repetition measures both, the order alternating (ref, sgl / sgl, ref / ...); the table gives
medians and the median of the per-repetition ratios. While one engine is measured the other's
process group is paused (SIGSTOP): without --sleep-on-idle (which the CPU flags set since this
benchmark found it) SGLang's scheduler busy-polls when idle, and on 2 cores that would take a
core from the engine being measured; pausing keeps any leftover idle work out too. Per engine:

- decode_tps: single-stream decode tok/s after the first token (streamed, greedy, ignore_eos);
- multi_tps: aggregate tok/s of 8 concurrent streams (first request sent to last token back);
- cold_prefill_s: client wall time of a max_new_tokens=1 request on a 1024-token prompt, cold;
- cached_prefill_s: the same prompt after its first 1000 tokens were cached by a request.

Run it in .venv-sglang (it needs sglang), alone on the machine:

    .venv-sglang/bin/python -m benchmarks.bench_sglang_cpu --reps 5 --out runs/bench_sglang_cpu
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shlex
import signal
import statistics
import sys
import time
from pathlib import Path

import aiohttp
import psutil

from benchmarks.bench_engine import random_prompts, uptime
from benchmarks.microbench import BenchError, flush, generate_body, post_json, stream_generate
from sglang_ext import protocol as P

# engine name -> backend of launch.worker_cmd.worker_argv
ENGINES = {"reference": "torch", "sglang": "sglang"}
# measure -> (label, higher is better)
MEASURES = {
    "decode_tps": ("single-stream decode tok/s (after the first token)", True),
    "multi_tps": ("aggregate tok/s, 8 streams", True),
    "cold_prefill_s": ("prefill s, 1024-token prompt, cold", False),
    "cached_prefill_s": ("prefill s, same prompt, 1000 tokens cached", False),
}
# Both engines get the same KV pool: SGLang's CPU flags fix it at 4096 tokens (cpu.py).
MAX_TOTAL_TOKENS = 4096


async def timed_prefill(
    s: aiohttp.ClientSession, url: str, prompt: list[int]
) -> tuple[float, dict]:
    t0 = time.perf_counter()
    reply = await post_json(s, f"{url}/generate", generate_body(prompt, 1))
    return time.perf_counter() - t0, reply[P.META_INFO]


async def measure(
    s: aiohttp.ClientSession, url: str, prompts: dict, rep: int, a: argparse.Namespace
) -> dict:
    """One repetition on one engine; every part starts from an empty radix cache."""
    n, out = a.decode_tokens, {}
    await flush(s, url)
    r = await stream_generate(s, url, generate_body(prompts["short"][0], n))
    if r.ttft_s is None:
        raise BenchError(f"{url}: no streamed chunk carried output ids")
    out["decode_tps"] = (n - 1) / (r.latency_s - r.ttft_s)
    await flush(s, url)
    t0 = time.perf_counter()
    await asyncio.gather(
        *(stream_generate(s, url, generate_body(p, n)) for p in prompts["short"][: a.streams])
    )
    out["multi_tps"] = a.streams * n / (time.perf_counter() - t0)
    long = prompts["long"][rep]
    await flush(s, url)
    out["cold_prefill_s"], meta = await timed_prefill(s, url, long)
    out["cold_cached_tokens"] = meta[P.CACHED_TOKENS]
    await flush(s, url)
    await post_json(s, f"{url}/generate", generate_body(long[: a.cached_len], 1))
    out["cached_prefill_s"], meta = await timed_prefill(s, url, long)
    out["cached_tokens"] = meta[P.CACHED_TOKENS]
    return out


async def greedy_ids(s: aiohttp.ClientSession, url: str, prompt: list[int], n: int) -> list[int]:
    reply = await post_json(s, f"{url}/generate", generate_body(prompt, n))
    return reply[P.OUTPUT_IDS]


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) used so far by the live processes of a process group."""
    total = 0.0
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                times = p.cpu_times()
                total += times.user + times.system
        except (ProcessLookupError, psutil.Error):
            continue  # exited meanwhile
    return total


async def idle_cpu(pgids: dict[str, int], seconds: float = 5.0) -> dict[str, float]:
    """Cores each engine's processes use while no request is in flight."""
    before = {e: group_cpu_s(pg) for e, pg in pgids.items()}
    await asyncio.sleep(seconds)
    return {e: round((group_cpu_s(pg) - before[e]) / seconds, 2) for e, pg in pgids.items()}


@contextlib.contextmanager
def paused(pgids: list[int]):
    """SIGSTOP the process groups for the duration, SIGCONT after, whatever happens."""
    for pgid in pgids:
        os.killpg(pgid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pgid in pgids:
            os.killpg(pgid, signal.SIGCONT)


async def run(
    urls: dict[str, str], pgids: dict[str, int], a: argparse.Namespace, vocab: int
) -> tuple[list[dict], dict]:
    rng = random.Random(a.seed)
    # 16-token prompts keep decode dominant; each repetition gets a fresh long prompt, and one
    # more long prompt warms each engine up.
    prompts = {
        "short": random_prompts(a.streams, 16, vocab, rng),
        "long": random_prompts(a.reps + 1, a.prompt_len, vocab, rng),
    }
    rows = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as s:
        # One-off costs of first calls (allocators, lazy init, first long shapes): not measured.
        for url in urls.values():
            await stream_generate(s, url, generate_body(prompts["short"][0], 4))
            await timed_prefill(s, url, prompts["long"][-1])
        # Same weights, both fp32: greedy ids should agree (a sanity check, not a timing).
        ids = {
            e: await greedy_ids(s, url, prompts["short"][0], a.decode_tokens)
            for e, url in urls.items()
        }
        same = next(
            (i for i, (x, y) in enumerate(zip(*ids.values())) if x != y),
            min(map(len, ids.values())),
        )
        check = {
            "greedy_ids_equal_prefix": same,
            "of": a.decode_tokens,
            "idle_cores": await idle_cpu(pgids),
        }
        for rep in range(a.reps):
            order = list(ENGINES) if rep % 2 == 0 else list(ENGINES)[::-1]
            row: dict = {"rep": rep, "order": " ".join(order)}
            for engine in order:
                with paused([pg for e, pg in pgids.items() if e != engine]):
                    m = await measure(s, urls[engine], prompts, rep, a)
                row.update({f"{engine}.{k}": v for k, v in m.items()})
                print(
                    f"rep {rep} {engine}: " + ", ".join(f"{k}={v:.4g}" for k, v in m.items()),
                    flush=True,
                )
            rows.append(row)
    return rows, check


def ratios(rows: list[dict], key: str) -> list[float]:
    """reference ÷ SGLang per repetition, oriented so that > 1 means the reference is better."""
    higher = MEASURES[key][1]
    return [
        r[f"reference.{key}"] / r[f"sglang.{key}"]
        if higher
        else r[f"sglang.{key}"] / r[f"reference.{key}"]
        for r in rows
    ]


def report(
    rows: list[dict], check: dict, a: argparse.Namespace, command: str, load: list[str]
) -> str:
    lines = [
        (
            "| measure | reference (median) | SGLang CPU (median) | reference vs SGLang "
            "(median of per-rep ratios; > 1: reference better) | per-rep | goal ≥ 1.0× met |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for key, (label, _) in MEASURES.items():
        ref = statistics.median(r[f"reference.{key}"] for r in rows)
        sgl = statistics.median(r[f"sglang.{key}"] for r in rows)
        per = ratios(rows, key)
        ratio = statistics.median(per)
        lines.append(
            f"| {label} | {ref:.4g} | {sgl:.4g} | **{ratio:.2f}×** | "
            f"{', '.join(f'{x:.2f}×' for x in per)} | {'yes' if ratio >= 1.0 else 'no'} |"
        )
    cached = {e: [r[f"{e}.cached_tokens"] for r in rows] for e in ENGINES}
    cold = {e: [r[f"{e}.cold_cached_tokens"] for r in rows] for e in ENGINES}
    lines += [
        "",
        (
            f"{a.reps} repetitions, engines alternating first, the idle one paused; "
            f"decode {a.decode_tokens} greedy tokens (ignore_eos) from 16-token random prompts; prefill = client "
            f"wall time of a max_new_tokens=1 request; KV pool {MAX_TOTAL_TOKENS} tokens "
            f"on both; cached_tokens of the cached prefill per rep: {cached} (cold: "
            f"{cold}); greedy ids of the two engines equal for the first "
            f"{check['greedy_ids_equal_prefix']} of {check['of']} tokens; CPU cores used by "
            f"each engine while idle, both running: {check['idle_cores']}."
        ),
        "",
        "Raw per repetition:",
        "",
        "```",
    ]
    lines += [
        ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items())
        for r in rows
    ]
    lines += [
        "```",
        "",
        f"Load (uptime) at start: `{load[0]}`; at end: `{load[1]}`",
        "",
        f"Command: `{command}`",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_sglang_cpu", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--out", default="runs/bench_sglang_cpu")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--cached-len", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model-path", default="smollm2-135m")
    a = p.parse_args(argv)
    try:
        import sglang  # noqa: F401 - only to fail early, with the fix
    except ImportError:
        print(
            "error: real SGLang is not installed in this venv; run it with "
            ".venv-sglang/bin/python (built by `make test-sglang`)",
            file=sys.stderr,
        )
        return 2
    from benchmarks.microbench_deploy import base_url, resolve, vocab_size, worker_spec
    from launch.procs import start, stop_groups, wait_healthy

    out = Path(a.out)
    model_dir = resolve(a.model_path)
    server_args = {"max_total_tokens": MAX_TOTAL_TOKENS}
    specs = {
        e: worker_spec(e, model_dir, "null", "127.0.0.1", server_args, backend)
        for e, backend in ENGINES.items()
    }
    load = [uptime()]
    procs = [start(spec, out / "logs") for spec in specs.values()]
    try:
        wait_healthy(procs, 600)
        urls = {e: base_url(spec) for e, spec in specs.items()}
        pgids = {e: proc.pid for e, proc in zip(specs, procs)}  # each leads its own group
        rows, check = asyncio.run(run(urls, pgids, a, vocab_size(a.model_path)))
    finally:
        stop_groups([proc.pid for proc in procs])
    load.append(uptime())
    command = shlex.join(
        [
            ".venv-sglang/bin/python",
            "-m",
            "benchmarks.bench_sglang_cpu",
            *(argv if argv is not None else sys.argv[1:]),
        ]
    )
    text = report(rows, check, a, command, load)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_sglang_cpu.md").write_text(text + "\n")
    (out / "rows.json").write_text(json.dumps({"rows": rows, "check": check}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
