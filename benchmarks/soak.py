"""Soak test (a script, not a test): bring a deployment up, send N OpenAI chat requests at a
fixed concurrency through the shell router, sample the RSS of every process it started, and
report each process's growth after warm-up. A leak shows as RSS that keeps climbing.

    python -m benchmarks.soak --config tree_3_1_cpu --requests 1000 --concurrency 8 \
        --max-tokens 8 --out runs/soak [--api-key]

`--api-key` runs the deployment behind an API key (MOA_PD_API_KEY's, else a random one) and
sends it with every request, as a client of an exposed endpoint does.

Writes OUT/soak.json (every sample) and prints one line per process: RSS at the end of
warm-up (the first --warmup-share of requests), at the end, and the growth in %. Every process
the deployment started is sampled, and their own children too (a worker's helper processes),
each under "NAME/child-PID".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shlex
import statistics
import sys
import threading
import time
from pathlib import Path

import aiohttp
import psutil
from tqdm import tqdm

from experiments.datasets import load_questions
from router.api_key import auth_headers, key_from_env


def rss_mb(pid: int) -> float | None:
    """Resident set size of pid in MiB (None once it is gone)."""
    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except psutil.Error:
        return None


class RssSampler(threading.Thread):
    """Samples every process's RSS each `interval_s`, tagged with the requests done so far.
    Children of the started processes are looked up every 30 s (a worker may start helpers)."""

    def __init__(self, procs: dict[str, int], interval_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.procs, self.interval_s = dict(procs), interval_s
        self.roots = dict(procs)
        self.done_requests = 0
        self.samples: list[dict] = []
        self._halt = threading.Event()

    def _find_children(self) -> None:
        for name, pid in self.roots.items():
            try:
                children = psutil.Process(pid).children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            for c in children:
                self.procs.setdefault(f"{name}/child-{c.pid}", c.pid)

    def run(self) -> None:
        last_scan = 0.0
        while not self._halt.is_set():
            if time.monotonic() - last_scan > 30:
                self._find_children()
                last_scan = time.monotonic()
            self.samples.append(
                {
                    "t": time.monotonic(),
                    "done": self.done_requests,
                    "load1": os.getloadavg()[0],
                    "rss_mb": {n: rss_mb(p) for n, p in self.procs.items()},
                }
            )
            self._halt.wait(self.interval_s)

    def stop(self) -> None:
        self._halt.set()
        self.join()


async def drive(
    url: str,
    model: str,
    n: int,
    concurrency: int,
    max_tokens: int,
    sampler: RssSampler,
    api_key: str | None = None,
) -> dict:
    questions = [q.question for q in load_questions("gsm8k", min(n, 1319))]
    latencies: list[float] = []
    errors: dict[str, int] = {}
    todo = iter(range(n))

    bar = tqdm(total=n, desc="soak", unit="req", file=sys.stderr, mininterval=5)

    async def worker(session: aiohttp.ClientSession) -> None:
        for i in todo:
            body = {
                "model": model,
                "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": questions[i % len(questions)]}],
            }
            t0 = time.perf_counter()
            try:
                async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                    await resp.read()
                    if resp.status != 200:
                        errors[str(resp.status)] = errors.get(str(resp.status), 0) + 1
            except aiohttp.ClientError as e:
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
            latencies.append(time.perf_counter() - t0)
            sampler.done_requests += 1
            bar.update(1)
            bar.set_postfix(errors=sum(errors.values()), refresh=False)

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout, headers=auth_headers(api_key)) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    bar.close()
    return {
        "requests": n,
        "concurrency": concurrency,
        "wall_s": wall,
        "errors": errors,
        "latency_median_s": statistics.median(latencies),
        "latency_p99_s": sorted(latencies)[int(0.99 * (len(latencies) - 1))],
    }


def growth(samples: list[dict], warm_done: int) -> dict[str, dict]:
    """Per process: median RSS over the samples around the end of warm-up and over the last
    10% of samples, and the growth between them in %."""
    after = [s for s in samples if s["done"] >= warm_done]
    head = after[: max(3, len(after) // 10)]
    tail = after[-max(3, len(after) // 10) :]
    out = {}
    for name in dict.fromkeys(n for s in samples for n in s["rss_mb"]):
        a = [s["rss_mb"][name] for s in head if s["rss_mb"].get(name) is not None]
        b = [s["rss_mb"][name] for s in tail if s["rss_mb"].get(name) is not None]
        if a and b:
            start, end = statistics.median(a), statistics.median(b)
            out[name] = {
                "warm_mb": round(start, 1),
                "end_mb": round(end, 1),
                "growth_pct": round(100 * (end - start) / start, 2),
                "max_mb": round(max(b + a), 1),
            }
    return out


def main(argv: list[str] | None = None) -> int:
    from launch.commands import make_stack
    from router.config_loader import load_config, resolve_config_path

    ap = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    ap.add_argument("--config", default="tree_3_1_cpu")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument(
        "--max-tokens",
        type=int,
        default=8,
        help="per agent (a copy of the config "
        "with every agent capped at this, so the soak measures requests, not "
        "decoding)",
    )
    ap.add_argument("--warmup-share", type=float, default=0.1)
    ap.add_argument(
        "--api-key",
        action="store_true",
        help="require an API key (MOA_PD_API_KEY's, else a random one) and send it",
    )
    ap.add_argument("--out", default="runs/soak")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = load_config(args.config)
    raw = json.loads(resolve_config_path(args.config).read_text(encoding="utf-8"))
    for agent in raw["agents"]:
        agent.setdefault("sampling", {})["max_new_tokens"] = args.max_tokens
    config_path = out / f"{cfg.name}.json"
    config_path.write_text(json.dumps(raw, indent=2))
    load_before = os.getloadavg()
    key = (key_from_env() or secrets.token_urlsafe(32)) if args.api_key else None
    stack = make_stack([str(config_path)], "torch", out / "deployment", "127.0.0.1", api_key=key)
    with stack:
        sampler = RssSampler({p.spec.name: p.pid for p in stack.procs})
        sampler.start()
        try:
            report = asyncio.run(
                drive(
                    stack.cluster()["shell_router_url"],
                    cfg.name,
                    args.requests,
                    args.concurrency,
                    args.max_tokens,
                    sampler,
                    key,
                )
            )
        finally:
            sampler.stop()
    report["rss"] = growth(sampler.samples, int(args.warmup_share * args.requests))
    report["warmup_requests"] = int(args.warmup_share * args.requests)
    report["api_key"] = bool(key)
    report["loadavg_before"], report["loadavg_after"] = load_before, os.getloadavg()
    report["command"] = shlex.join(["python", "-m", "benchmarks.soak", *(argv or sys.argv[1:])])
    (out / "soak.json").write_text(json.dumps({**report, "samples": sampler.samples}, indent=1))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
