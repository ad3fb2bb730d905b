"""Placement (issue 11, item 6): workers pinned to their own cores against the OS's placement, on
whole questions. Two deployments of the same config run side by side (idle workers use no CPU),
one started with `--pin-cpus` (prefill workers from the first core, decode workers from the
last; planning/pack.plan_cpus), one without. Per question, setting #3 (pipelined) runs on both,
in alternating order, each on freshly flushed caches.

Reports the median of per-question ratios pinned ÷ unpinned (with a 95% bootstrap interval) for
end-to-end latency and the last leaf's end, and whether both gave the same tokens. Writes
OUT/results_{pinned,unpinned}.jsonl and OUT/bench_placement.md.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_placement --num-samples 10 --offset 400 \
        --out runs/bench_placement
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from benchmarks.bench_meta import BenchRun, cpu_device, provenance
from benchmarks.bench_overlap import PIPELINED, fmt_ci, last_leaf_end, log, run_one
from experiments.datasets import Question, load_questions
from experiments.results import ResultsWriter, read_results
from experiments.router_client import RouterClient
from experiments.run import flush_worker_caches
from launch.commands import bring_up, make_stack
from router.config_loader import load_config

VARIANTS = ("pinned", "unpinned")


async def _run(
    clusters: dict[str, dict], cfg_name: str, questions: list[Question], out: Path
) -> None:
    writers = {v: ResultsWriter(out / f"results_{v}.jsonl") for v in VARIANTS}
    async with (
        RouterClient(clusters["pinned"]["shell_router_url"]) as pinned,
        RouterClient(clusters["unpinned"]["shell_router_url"]) as unpinned,
    ):
        clients = {"pinned": pinned, "unpinned": unpinned}
        warmup = Question("warmup", "What is 1 + 1?", "2", "gsm8k")
        for v in VARIANTS:  # untimed: tokenizers and code paths
            await run_one(clients[v], cfg_name, warmup, PIPELINED)
        for i, q in enumerate(questions):
            order = VARIANTS if i % 2 == 0 else VARIANTS[::-1]
            times = {}
            for v in order:
                await flush_worker_caches(clients[v], clusters[v])
                row = await run_one(clients[v], cfg_name, q, PIPELINED)
                writers[v].append(row)
                times[v] = row["e2e_s"]
            log(
                f"{q.id}: pinned {times['pinned']:6.1f}s  unpinned {times['unpinned']:6.1f}s  "
                f"ratio {times['pinned'] / times['unpinned']:.3f}"
            )


def report(out: Path, meta: dict) -> str:
    rows = {
        v: {r.sample_id: r for r in read_results(out / f"results_{v}.jsonl") if r.ok}
        for v in VARIANTS
    }
    common = sorted(set(rows["pinned"]) & set(rows["unpinned"]))

    def ratios(metric) -> list[float]:
        return [metric(rows["pinned"][q]) / metric(rows["unpinned"][q]) for q in common]

    same = sum(
        all(
            a.output_ids == rows["unpinned"][q].agents[k].output_ids
            for k, a in rows["pinned"][q].agents.items()
        )
        for q in common
    )
    return (
        "\n".join(
            [
                f"### Placement: {meta['config']}, setting #3, {len(common)} questions ({meta['device']})",
                "",
                provenance(meta),
                "",
                "| pinned ÷ unpinned (paired per question) | median [95% CI] |",
                "|---|---|",
                f"| end-to-end latency | {fmt_ci(ratios(lambda r: r.e2e_s))} |",
                f"| last leaf's end | {fmt_ci(ratios(last_leaf_end))} |",
                f"| identical tokens, every agent | {same} of {len(common)} questions |",
            ]
        )
        + "\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="tree_9_3_1_cpu")
    ap.add_argument("--dataset", default="gsm8k")
    ap.add_argument("--num-samples", type=int, default=10)
    ap.add_argument("--offset", type=int, default=400, help="skip the dataset's first N questions")
    ap.add_argument("--out", default="runs/bench_placement")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for v in VARIANTS:
        (out / f"results_{v}.jsonl").unlink(missing_ok=True)
    cfg = load_config(args.config)
    questions = load_questions(args.dataset, args.offset + args.num_samples)[args.offset :]
    bench = BenchRun("benchmarks.bench_placement")
    stacks = {
        v: make_stack(
            [args.config], "torch", out / f"deploy_{v}", "127.0.0.1", pin_cpus=v == "pinned"
        )
        for v in VARIANTS
    }
    try:
        clusters = {v: bring_up(s) for v, s in stacks.items()}
        asyncio.run(_run(clusters, cfg.name, questions, out))
    finally:
        for s in stacks.values():
            s.down()
    meta = bench.meta(config=cfg.name, device=cpu_device())
    text = report(out, meta)
    print(text)
    (out / "bench_placement.md").write_text(text)


if __name__ == "__main__":
    main()
