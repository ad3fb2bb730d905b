"""Workflow priority against FCFS under load (issue 28, item 5): setting #3 (pipelined) on one
worker deployment started with `--enable-priority-scheduling`, two shell routers over it that
differ only in `workflow_priority` (router/priority.py), on whole questions.

Per concurrency N: the questions in blocks; each block runs through both routers in turn (the
order alternating per block), on cold caches, N questions in flight. Per variant it reports the
throughput (questions per second of block wall time) and two latencies per question:
- in flight: from the question's start to its answer, as `moa-pd run --concurrency N` counts it
  (a closed loop: by Little's law the mean is N ÷ throughput, whatever the order);
- from arrival: from the block's start, when every question of the block arrived, waiting for a
  place among the N included (what a queue of users sees).
Ratios are workflow ÷ FCFS per question (the same question in the same block), medians with a
95% bootstrap interval. The deployment is started for the largest N (`moa-pd up --concurrency`:
its decode workers admit what N questions have in flight), as `moa-pd run` starts its own, or
for `--deploy-concurrency` (1: the engine's default 16 running requests).
Writes OUT/priority.jsonl and OUT/bench_priority.md.

With `--request-rate R` the questions of a block arrive as an open loop instead, at Poisson
times of rate R per second (seeded, the same times for both variants, as SGLang's
`bench_serving --request-rate`), N in flight at most; "from arrival" then counts from each
question's own arrival. A closed loop's latency is fixed by its throughput (Little's law) and a
block that arrives at once ends with its whole work, whatever the order; arrivals spread in time
are where an order can shorten the tail too.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_priority --num-samples 16 --offset 800 \
        --concurrency 4,8 --out runs/bench_priority
    OMP_NUM_THREADS=1 python -m benchmarks.bench_priority --num-samples 16 --offset 800 \
        --concurrency 8 --request-rate 0.06 --out runs/bench_priority_open
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

from benchmarks.bench_meta import BenchRun, cpu_device, provenance
from benchmarks.bench_overlap import log
from benchmarks.shell_routers import routers_over_one_deployment
from experiments.datasets import Question, load_questions
from experiments.paired_stats import median_ci
from experiments.prompts import build_question_prompt
from experiments.router_client import RouterClient
from experiments.run import flush_worker_caches

VARIANTS = {  # name: cluster overrides (both send the priority field)
    "fcfs": {"priority_scheduling": True, "workflow_priority": False},
    "workflow": {"priority_scheduling": True, "workflow_priority": True},
}


def arrival_times(count: int, rate: float | None, seed: int) -> list[float]:
    """Seconds from a block's start at which its `count` questions arrive: all at once (closed
    loop, `rate` None), or a Poisson process of `rate` per second, the first at 0."""
    if rate is None:
        return [0.0] * count
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=count)
    return [0.0, *np.cumsum(gaps[1:]).tolist()]


async def run_block(
    url: str,
    cfg_name: str,
    questions: list[Question],
    n: int,
    arrivals: list[float],
    mode: str = "pipelined",
) -> list[dict]:
    """The block's questions in router `mode`, each arriving at its time in `arrivals` (seconds
    from the block's start), `n` in flight at most; one row per question (`position`: its
    place in the block, by which it started)."""
    sem = asyncio.Semaphore(n)
    async with RouterClient(url) as client:
        t0 = time.perf_counter()

        async def one(position: int, q: Question, at: float) -> dict:
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            async with sem:
                start = time.perf_counter()
                await client.run_graph(build_question_prompt(q), q.id, cfg_name, mode, False)
                end = time.perf_counter()
            return {
                "id": q.id,
                "position": position,
                "start_s": start - t0,
                "arrival_s": at,
                "in_flight_s": end - start,
                "from_arrival_s": end - (t0 + at),
            }

        rows = await asyncio.gather(
            *(one(i, q, at) for i, (q, at) in enumerate(zip(questions, arrivals)))
        )
        wall = time.perf_counter() - t0
    return [{**r, "block_wall_s": wall} for r in rows]


async def run(cluster: dict, urls: dict[str, str], cfg_name: str, questions, args, out: Path):
    rows = []
    with (out / "priority.jsonl").open("w") as f:
        for n in args.concurrency:
            blocks = [questions[i : i + args.block] for i in range(0, len(questions), args.block)]
            for b, qs in enumerate(blocks):
                order = list(VARIANTS) if b % 2 == 0 else list(VARIANTS)[::-1]
                for variant in order:
                    async with RouterClient(urls[variant]) as client:
                        await flush_worker_caches(client, cluster)
                    arrivals = arrival_times(len(qs), args.request_rate, seed=b)
                    block_rows = await run_block(urls[variant], cfg_name, qs, n, arrivals)
                    for r in block_rows:
                        r.update(
                            concurrency=n, block=b, variant=variant, request_rate=args.request_rate
                        )
                        rows.append(r)
                        f.write(json.dumps(r) + "\n")
                    f.flush()
                    log(f"c{n} block {b} {variant:8s}: {len(qs)} questions in "
                        f"{block_rows[0]['block_wall_s']:.1f}s")  # fmt: skip
    return rows


def latency_stats(rows: list[dict], key: str) -> str:
    """Mean / median / p90 of `key` over `rows`, in seconds."""
    xs = [r[key] for r in rows]
    return f"{statistics.mean(xs):.1f} / {statistics.median(xs):.1f} / {np.percentile(xs, 90):.1f}"


def report(rows: list[dict], meta: dict) -> str:
    lines = [
        "# Workflow priority vs FCFS (setting #3)",
        "",
        provenance(meta),
        "",
        (
            "| N | variant | questions | throughput q/s | in flight: mean / median / p90 s "
            "| from arrival: mean / median / p90 s |"
        ),
        "|---|---|---|---|---|---|",
    ]
    ratio_lines = []
    for n in sorted({r["concurrency"] for r in rows}):
        at_n = [r for r in rows if r["concurrency"] == n]
        for variant in VARIANTS:
            mine = [r for r in at_n if r["variant"] == variant]
            walls = {r["block"]: r["block_wall_s"] for r in mine}
            tput = len(mine) / sum(walls.values())
            lines.append(
                f"| {n} | {variant} | {len(mine)} | {tput:.4f} | {latency_stats(mine, 'in_flight_s')} "
                f"| {latency_stats(mine, 'from_arrival_s')} |"
            )
        by = {(r["variant"], r["block"], r["id"]): r for r in at_n}
        pairs = [
            (by[("workflow", b, i)], r)
            for (v, b, i), r in by.items()
            if v == "fcfs" and ("workflow", b, i) in by
        ]
        for key in ("in_flight_s", "from_arrival_s"):
            ratios = [w[key] / f[key] for w, f in pairs]
            med, lo, hi = median_ci(ratios)
            means = statistics.mean(w[key] for w, _ in pairs) / statistics.mean(
                f[key] for _, f in pairs
            )
            ratio_lines.append(
                f"| {n} | {key.removesuffix('_s').replace('_', ' ')} | {med:.3f} [{lo:.3f}, "
                f"{hi:.3f}] | {means:.3f} | {max(ratios):.3f} |"
            )
    lines += [
        "",
        "| N | latency | workflow ÷ FCFS per question, median [95% CI] | ratio of means | worst |",
        "|---|---|---|---|---|",
        *ratio_lines,
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="tree_9_3_1_cpu")
    ap.add_argument("--dataset", default="gsm8k")
    ap.add_argument("--num-samples", type=int, default=16, help="questions per concurrency")
    ap.add_argument("--offset", type=int, default=0, help="skip the dataset's first N questions")
    ap.add_argument(
        "--concurrency",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[4, 8],
        help="questions in flight, comma-separated (default 4,8)",
    )
    ap.add_argument("--block", type=int, default=8, help="questions per block")
    ap.add_argument(
        "--request-rate",
        type=float,
        default=None,
        help="questions per second arriving as an open loop (Poisson, seeded per block), "
        "--concurrency in flight at most; default: a block's questions all arrive at its start",
    )
    ap.add_argument(
        "--deploy-concurrency",
        type=int,
        default=None,
        help="start the workers for this many questions in flight (`moa-pd up --concurrency`: "
        "the decode workers' running requests); default: the largest --concurrency",
    )
    ap.add_argument("--out", default="runs/bench_priority")
    args = ap.parse_args()
    if args.num_samples < 1 or args.block < 1 or min(args.concurrency) < 1:
        ap.error("--num-samples, --block and every --concurrency must be at least 1")
    if args.deploy_concurrency is not None and args.deploy_concurrency < 1:
        ap.error(f"--deploy-concurrency must be at least 1, got {args.deploy_concurrency}")
    if args.request_rate is not None and args.request_rate <= 0:
        ap.error(f"--request-rate must be above 0 questions per second, got {args.request_rate}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    questions = load_questions(args.dataset, args.offset + args.num_samples)[args.offset :]
    bench = BenchRun("benchmarks.bench_priority")
    # By default started as `moa-pd run --concurrency N` starts its deployment: decode workers
    # with the running requests N questions need (the largest N of the run).
    deployed_for = args.deploy_concurrency or max(args.concurrency)
    with routers_over_one_deployment(args.config, out, VARIANTS, deployed_for) as r:
        rows = asyncio.run(run(r.cluster, r.urls, r.config_name, questions, args, out))
    meta = bench.meta(
        config=args.config,
        dataset=args.dataset,
        first=questions[0].id,
        last=questions[-1].id,
        concurrency=args.concurrency,
        block=args.block,
        request_rate=args.request_rate,
        deployed_for_concurrency=deployed_for,
        device=cpu_device(False),
    )
    text = report(rows, meta)
    print(text)
    (out / "bench_priority.md").write_text(text)


if __name__ == "__main__":
    main()
