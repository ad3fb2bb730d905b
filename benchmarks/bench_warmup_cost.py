"""The warm-up gate that weighs its cost (issue 28, item 2) against the one that counts slots, and
both against blocking, on whole questions at each concurrency. One worker deployment, three shell
routers over it (benchmarks/shell_routers.py):

- `#2`: blocking (no warm-ups), the reference;
- `#3-slots`: pipelined, a warm-up admitted where its prefill worker fits the device's slots
  beside the busy workers (the gate before this benchmark: `warmup_weigh_slowdown` false);
- `#3-weighed`: pipelined, a warm-up also admitted only if it pays for the decodes it slows, as
  the router measures them (router/compute_device.py, router/decode_slowdown.py).

Per concurrency N the questions run in blocks, N in flight, through each router in turn on cold
caches (the order rotating per block). Reports per variant the throughput, the in-flight latency,
the warm-ups per question (the router's /metrics), the slowdown each router measured; and per
question the ratio to #2 in the same block, over all questions and over those that started last
(position ≥ N in their block: they start as the first ones end, the ones that lost under load
before). Writes OUT/warmup_cost.jsonl and OUT/bench_warmup_cost.md.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_warmup_cost --num-samples 16 --offset 0 \\
        --concurrency 4 --out runs/bench_warmup_cost
"""

from __future__ import annotations

import asyncio
import os
import statistics
from pathlib import Path

from benchmarks.bench_meta import BenchRun, cpu_device, provenance
from benchmarks.shell_routers import routers_over_one_deployment
from benchmarks.variant_blocks import (
    Variant,
    block_arguments,
    check_block_arguments,
    latency_stats,
    ratio_lines,
    router_metrics,
    run_variants,
    throughput,
    warmup_fields,
)
from experiments.datasets import load_questions

VARIANTS = {
    "#2": Variant("blocking"),
    "#3-slots": Variant("pipelined", {"warmup_weigh_slowdown": False}),
    "#3-weighed": Variant("pipelined", {"warmup_weigh_slowdown": True}),
}
REFERENCE = "#2"


async def run(cluster: dict, urls: dict[str, str], cfg_name: str, questions, args, out: Path):
    return await run_variants(
        cluster,
        urls,
        VARIANTS,
        cfg_name,
        questions,
        args.concurrency,
        args.block,
        out / "warmup_cost.jsonl",
        measure=router_metrics,
        fields=warmup_fields,
    )


def report(rows: list[dict], meta: dict) -> str:
    lines = [
        "# The warm-up gate: weighed by measured slowdown vs slots alone vs blocking",
        "",
        provenance(meta),
        "",
        (
            "| N | variant | questions | throughput q/s | in flight: mean / median / p90 s "
            "| warm-ups per question | measured slowdown at the end |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    ratios = []
    for n in sorted({r["concurrency"] for r in rows}):
        at_n = [r for r in rows if r["concurrency"] == n]
        for variant in VARIANTS:
            mine = [r for r in at_n if r["variant"] == variant]
            if not mine:
                continue
            warm = statistics.mean(r["warmups_per_q"] for r in mine)
            slow = ", ".join(
                f"{k.removeprefix('slowdown.')} {v:.3f}"
                for k, v in mine[-1].items()
                if k.startswith("slowdown.")
            )
            lines.append(
                f"| {n} | {variant} | {len(mine)} | {throughput(mine):.4f} "
                f"| {latency_stats(mine, 'in_flight_s')} | {warm:.1f} | {slow or '-'} |"
            )
        for variant in VARIANTS:
            if variant != REFERENCE:
                ratios += ratio_lines(at_n, n, variant, REFERENCE)
    lines += [
        "",
        f"| N | variant | questions | n | ÷ {REFERENCE} per question, median [95% CI] | best | worst |",
        "|---|---|---|---|---|---|---|",
        *ratios,
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = block_arguments(__doc__.splitlines()[0], [4], 8, "runs/bench_warmup_cost")
    args = ap.parse_args()
    check_block_arguments(ap, args)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    questions = load_questions(args.dataset, args.offset + args.num_samples)[args.offset :]
    bench = BenchRun("benchmarks.bench_warmup_cost")
    overrides = {name: v.overrides for name, v in VARIANTS.items()}
    with routers_over_one_deployment(args.config, out, overrides, max(args.concurrency)) as r:
        rows = asyncio.run(run(r.cluster, r.urls, r.config_name, questions, args, out))
    meta = bench.meta(
        config=args.config,
        dataset=args.dataset,
        first=questions[0].id,
        last=questions[-1].id,
        concurrency=args.concurrency,
        block=args.block,
        device=cpu_device(False),
    )
    text = report(rows, meta)
    print(text)
    (out / "bench_warmup_cost.md").write_text(text)


if __name__ == "__main__":
    main()
