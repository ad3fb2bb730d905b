"""The order a question's agents start in (router/priority.start_order; issue 28, item 5's
"remaining critical path"): the longest remaining decode path first against the config's order,
in blocking (#2) and pipelined (#3) mode, on whole questions. One worker deployment as
`moa-pd run` starts it, a shell router per variant over it (benchmarks/shell_routers.py):

- `#2-config`, `#3-config`: the agents start in the config's order (the router's default);
- `#2-critical`, `#3-critical`: the agent with the longest remaining path starts first, so the
  first layer's prompts reach the prefill worker in that order (`start_order:
  critical_path`; the default is `config`);
- `#2-shortest`, `#3-shortest` (with `--variants`): as `critical`, on a copy of the config whose
  slots fill shortest answer first (`slot_order: shortest_first`), the same prompt in both
  modes with no order handed over.

Per concurrency N the questions run in blocks, N in flight, through each router in turn on cold
caches (the order rotating per block; `--block 1` at concurrency 1 pairs every question in
back-to-back runs). Reports per variant the throughput, the in-flight latency, the warm-ups per
question and the median critical path (experiments/critical_path.py); per question the ratio of
each critical-path-first variant to its config-order one and of #3 to #2 in each order. Writes
OUT/start_order.jsonl and OUT/bench_start_order.md.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_start_order --num-samples 20 --offset 900 \\
        --concurrency 1 --block 1 --out runs/bench_start_order_c1
"""

from __future__ import annotations

import asyncio
import os
import statistics
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
from experiments.critical_path import PARTS
from experiments.datasets import load_questions

CRITICAL = {"start_order": "critical_path"}
VARIANTS = {
    "#2-config": Variant("blocking", {"start_order": "config"}),
    "#3-config": Variant("pipelined", {"start_order": "config"}),
    "#2-critical": Variant("blocking", CRITICAL),
    "#3-critical": Variant("pipelined", CRITICAL),
    # The critical-path start order with the slots filled shortest answer first
    # (router/successor_prompt.py), the config's own order otherwise.
    "#2-shortest": Variant("blocking", CRITICAL, {"slot_order": "shortest_first"}),
    "#3-shortest": Variant("pipelined", CRITICAL, {"slot_order": "shortest_first"}),
}
DEFAULT_VARIANTS = ("#2-config", "#3-config", "#2-critical", "#3-critical")
# (variant, its reference) for the per-question ratios.
COMPARISONS = (
    ("#2-critical", "#2-config"),
    ("#3-critical", "#3-config"),
    ("#3-config", "#2-config"),
    ("#3-critical", "#2-critical"),
    ("#2-shortest", "#2-critical"),
    ("#3-shortest", "#3-critical"),
    ("#3-shortest", "#2-shortest"),
)


def median_parts(rows: list[dict]) -> str:
    """The median seconds of each critical-path part over `rows`, as `a / b / c / d`."""
    parts = [r["critical_path"] for r in rows if r.get("critical_path")]
    if not parts:
        return "-"
    return " / ".join(f"{statistics.median(p[k] for p in parts):.2f}" for k in PARTS)


def report(rows: list[dict], meta: dict) -> str:
    lines = [
        "# Start order: the longest remaining path first vs the config's order",
        "",
        provenance(meta),
        "",
        (
            "| N | variant | questions | throughput q/s | in flight: mean / median / p90 s "
            f"| warm-ups per question | critical path, median s ({' / '.join(PARTS)}) "
            "| measured slowdown at the end |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    ratios, tputs = [], []
    for n in sorted({r["concurrency"] for r in rows}):
        at_n = [r for r in rows if r["concurrency"] == n]
        for variant in VARIANTS:
            mine = [r for r in at_n if r["variant"] == variant]
            if not mine:
                continue
            warm = statistics.mean(r["warmups"] for r in mine)
            slow = by_device(mine[-1], "slowdown.")
            lines.append(
                f"| {n} | {variant} | {len(mine)} | {throughput(mine):.4f} "
                f"| {latency_stats(mine, 'in_flight_s')} | {warm:.1f} | {median_parts(mine)} "
                f"| {slow or '-'} |"
            )
        ran = {r["variant"] for r in at_n}
        for variant, reference in COMPARISONS:
            if not {variant, reference} <= ran:
                continue
            label = f"{variant} ÷ {reference}"
            ratios += ratio_lines(at_n, n, variant, reference, label)
            tput = throughput([r for r in at_n if r["variant"] == variant]) / throughput(
                [r for r in at_n if r["variant"] == reference]
            )
            tputs.append(f"| {n} | {label} | {tput:.3f} |")
    lines += [
        "",
        "| N | variant ÷ reference | questions | n | per question, median [95% CI] | best | worst |",
        "|---|---|---|---|---|---|---|",
        *ratios,
        "",
        "| N | variant ÷ reference | throughput ratio |",
        "|---|---|---|",
        *tputs,
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = block_arguments(__doc__.splitlines()[0], [1], 1, "runs/bench_start_order")
    variants_argument(ap, VARIANTS, DEFAULT_VARIANTS)
    args = ap.parse_args()
    check_block_arguments(ap, args)
    variants = chosen_variants(ap, args, VARIANTS)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    questions = load_questions(args.dataset, args.offset + args.num_samples)[args.offset :]
    bench = BenchRun("benchmarks.bench_start_order")
    overrides = {name: v.overrides for name, v in variants.items()}
    edits = {name: v.config_edits for name, v in variants.items() if v.config_edits}
    concurrency = max(args.concurrency)
    # The deployment `moa-pd run --concurrency N` starts: the workers as the config has them.
    with (
        one_line_on_interrupt(out / "start_order.jsonl"),
        routers_over_one_deployment(args.config, out, overrides, concurrency, False, edits) as r,
    ):
        rows = asyncio.run(
            run_variants(
                r.cluster,
                r.urls,
                variants,
                r.config_names,
                questions,
                args.concurrency,
                args.block,
                out / "start_order.jsonl",
                measure=router_metrics,
                fields=warmup_fields,
            )
        )
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
    (out / "bench_start_order.md").write_text(text)


if __name__ == "__main__":
    main()
