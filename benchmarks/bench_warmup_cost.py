"""The warm-up gate that weighs its cost (issue 28, item 2) against the one that counts slots, and
both against blocking, on whole questions at each concurrency. One worker deployment, a shell
router per variant over it (benchmarks/shell_routers.py):

- `#2`: blocking (no warm-ups), the reference;
- `#3-slots`: pipelined, a warm-up admitted where its prefill worker fits the device's slots
  beside the busy workers (the gate before issue 28: `warmup_weigh_slowdown` false);
- `#3-weighed`: pipelined, a warm-up also admitted only if it pays for the decodes it slows, by
  the slowdown the router measures (router/compute_device.py, router/decode_slowdown.py), its
  estimate (the default);
- `#3-lower`, `#3-upper`: the same by the estimate's one-sided 95% bound below it (refused only
  when the meter is sure a warm-up does not pay) and above it (admitted only when sure it pays):
  `warmup_slowdown_confidence` 0.95 and 0.05.

Per concurrency N the questions run in blocks, N in flight, through each router in turn on cold
caches (the order rotating per block). Reports per variant the throughput, the in-flight latency,
the warm-ups per question in each block (the router's /metrics: a gate that flips shows here),
the slowdown each router measured and as its gate weighs it; and per question the ratio to #2
in the same block, over all questions and over those that started last (position ≥ N in their
block: they start as the first ones end, the ones that lost under load before). The workers
schedule by priority unless --no-priority-scheduling (then as the config starts them, as
`moa-pd run` does). Writes OUT/warmup_cost.jsonl and OUT/bench_warmup_cost.md.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_warmup_cost --num-samples 16 --offset 0 \\
        --concurrency 4 --out runs/bench_warmup_cost
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from benchmarks.bench_meta import BenchRun, cpu_device, provenance
from benchmarks.shell_routers import one_line_on_interrupt, routers_over_one_deployment
from benchmarks.variant_blocks import (
    Variant,
    block_arguments,
    by_device,
    check_block_arguments,
    chosen_variants,
    latency_stats,
    ratio_lines,
    router_metrics,
    run_variants,
    throughput,
    variants_argument,
    warmup_fields,
)
from experiments.datasets import load_questions


def _weighed(confidence: float) -> Variant:
    return Variant(
        "pipelined", {"warmup_weigh_slowdown": True, "warmup_slowdown_confidence": confidence}
    )


VARIANTS = {
    "#2": Variant("blocking"),
    "#3-slots": Variant("pipelined", {"warmup_weigh_slowdown": False}),
    "#3-weighed": _weighed(0.5),
    "#3-lower": _weighed(0.95),
    "#3-upper": _weighed(0.05),
}
DEFAULT_VARIANTS = ("#2", "#3-slots", "#3-weighed")
REFERENCE = "#2"


async def run(r, variants: dict[str, Variant], questions, args, out: Path) -> list[dict]:
    return await run_variants(
        r.cluster,
        r.urls,
        variants,
        r.config_name,
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
            "| warm-ups per question, each block | measured slowdown (as weighed) at the end |"
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
            blocks = {r["block"]: r["warmups_per_q"] for r in mine}
            warm = " / ".join(f"{blocks[b]:.1f}" for b in sorted(blocks))
            slow, low = by_device(mine[-1], "slowdown."), by_device(mine[-1], "slowdown_weighed.")
            lines.append(
                f"| {n} | {variant} | {len(mine)} | {throughput(mine):.4f} "
                f"| {latency_stats(mine, 'in_flight_s')} | {warm} "
                f"| {slow or '-'}{f' ({low})' if low else ''} |"
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
    variants_argument(ap, VARIANTS, DEFAULT_VARIANTS)
    ap.add_argument(
        "--priority-scheduling",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="start the workers scheduling by priority (default); --no-priority-scheduling: "
        "as the config starts them, as `moa-pd run` does",
    )
    args = ap.parse_args()
    check_block_arguments(ap, args)
    variants = chosen_variants(ap, args, VARIANTS)
    if REFERENCE not in variants:
        ap.error(f"--variants: every variant is reported against {REFERENCE}; name it too")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    questions = load_questions(args.dataset, args.offset + args.num_samples)[args.offset :]
    bench = BenchRun("benchmarks.bench_warmup_cost")
    overrides = {name: v.overrides for name, v in variants.items()}
    concurrency = max(args.concurrency)
    with (
        one_line_on_interrupt(out / "warmup_cost.jsonl"),
        routers_over_one_deployment(
            args.config, out, overrides, concurrency, args.priority_scheduling
        ) as r,
    ):
        rows = asyncio.run(run(r, variants, questions, args, out))
    meta = bench.meta(
        config=args.config,
        dataset=args.dataset,
        first=questions[0].id,
        last=questions[-1].id,
        concurrency=args.concurrency,
        block=args.block,
        priority_scheduling=args.priority_scheduling,
        device=cpu_device(False),
    )
    text = report(rows, meta)
    print(text)
    (out / "bench_warmup_cost.md").write_text(text)


if __name__ == "__main__":
    main()
