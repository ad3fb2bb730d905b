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

import asyncio
import os
import statistics
from pathlib import Path

import numpy as np

from benchmarks.bench_meta import BenchRun, cpu_device, provenance
from benchmarks.shell_routers import one_line_on_interrupt, routers_over_one_deployment
from benchmarks.variant_blocks import (
    Variant,
    block_arguments,
    check_block_arguments,
    latency_stats,
    paired,
    run_variants,
    throughput,
)
from experiments.datasets import load_questions
from experiments.paired_stats import median_ci

VARIANTS = {  # both send the priority field
    "fcfs": Variant(overrides={"priority_scheduling": True, "workflow_priority": False}),
    "workflow": Variant(overrides={"priority_scheduling": True, "workflow_priority": True}),
}


def arrival_times(count: int, rate: float | None, seed: int) -> list[float]:
    """Seconds from a block's start at which its `count` questions arrive: all at once (closed
    loop, `rate` None), or a Poisson process of `rate` per second, the first at 0."""
    if rate is None:
        return [0.0] * count
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=count)
    return [0.0, *np.cumsum(gaps[1:]).tolist()]


async def run(cluster: dict, urls: dict[str, str], cfg_name: str, questions, args, out: Path):
    def arrivals(block: int, count: int) -> list[float]:
        return arrival_times(count, args.request_rate, seed=block)

    return await run_variants(
        cluster,
        urls,
        VARIANTS,
        cfg_name,
        questions,
        args.concurrency,
        args.block,
        out / "priority.jsonl",
        arrivals,
        tags={"request_rate": args.request_rate},
    )


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
            tput = throughput(mine)
            lines.append(
                f"| {n} | {variant} | {len(mine)} | {tput:.4f} | {latency_stats(mine, 'in_flight_s')} "
                f"| {latency_stats(mine, 'from_arrival_s')} |"
            )
        pairs = paired(at_n, "workflow", "fcfs")
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
    ap = block_arguments(__doc__.splitlines()[0], [4, 8], 8, "runs/bench_priority")
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
    args = ap.parse_args()
    check_block_arguments(ap, args)
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
    overrides = {name: v.overrides for name, v in VARIANTS.items()}
    with (
        one_line_on_interrupt(out / "priority.jsonl"),
        routers_over_one_deployment(args.config, out, overrides, deployed_for) as r,
    ):
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
