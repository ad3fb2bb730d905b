"""Where pipelined's last warm-ups land (issue 28, item 4: realized ÷ possible at concurrency 1):
blocking (#2) against pipelined (#3) with and without the warm-up timed to the last precursor's
cap (`incremental_prefill.warm_before_cap`), on whole questions. One worker deployment as
`moa-pd run` starts it, a shell router per variant over it (benchmarks/shell_routers.py):

- `#2`: blocking, the reference (its exposed prefill is what overlap could save);
- `#3`: pipelined as shipped, warm-ups every `min_chunk_tokens` only, so the final request
  prefills up to that many of its last precursor's tokens itself;
- `#3-timed`: pipelined with `warm_before_cap: true`, one more warm-up as the last precursor
  nears its cap;
- `#3-waits`: pipelined with `final_beside_warmup: false`: the final request waits for the reply
  of a warm-up still in flight when the prompt completed (the others send it at once, beside
  that warm-up).
Per concurrency N the questions run in blocks, N in flight, through each router in turn on cold
caches (the order rotating per block; `--block 1` at concurrency 1 pairs every question in
back-to-back runs). Reports per variant the throughput, the in-flight latency, the warm-ups per
question, the critical path's median parts and, summed over its successors, the tokens their
final requests prefilled themselves and the router's wait between a last precursor's end and
the request; per pipelined variant against #2, realized ÷ possible (Σ over questions: #2's exposed
prefill is possible, #2 − #3 realized) and the per-question ratios and how many questions were
token-identical to #2. Writes OUT/warmup_timing.jsonl and OUT/bench_warmup_timing.md.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_warmup_timing --num-samples 20 --offset 1276 \\
        --concurrency 1 --block 1 --out runs/bench_warmup_timing_c1
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
from pathlib import Path

from benchmarks.bench_meta import BenchRun, cpu_device, provenance
from benchmarks.shell_routers import one_line_on_interrupt, routers_over_one_deployment
from benchmarks.variant_blocks import (
    Variant,
    block_arguments,
    check_block_arguments,
    chosen_variants,
    latency_stats,
    paired,
    ratio_lines,
    router_metrics,
    run_variants,
    throughput,
    variants_argument,
    warmup_fields,
)
from experiments.critical_path import PARTS
from experiments.datasets import load_questions
from router.config_loader import resolve_config_path

VARIANTS = {
    "#2": Variant("blocking"),
    "#3": Variant("pipelined"),
    "#3-timed": Variant("pipelined"),  # the config edits of these two: `policy_edit`
    "#3-waits": Variant("pipelined"),
}
# Each edited variant's incremental_prefill fields.
EDITS = {"#3-timed": {"warm_before_cap": True}, "#3-waits": {"final_beside_warmup": False}}
DEFAULT_VARIANTS = tuple(VARIANTS)
REFERENCE = "#2"
DETAIL = ("uncached_tokens", "send_wait_s")


def policy_edit(config: str, variant: str) -> dict:
    """The config edit of an edited variant: the config's `incremental_prefill` as it is, with
    that variant's fields (an edit replaces a top-level key whole, so it keeps the others)."""
    raw = json.loads(resolve_config_path(config).read_text(encoding="utf-8"))
    return {"incremental_prefill": {**raw.get("incremental_prefill", {}), **EDITS[variant]}}


def realized_over_possible(rows: list[dict], variant: str) -> tuple[float, float] | None:
    """(Σ #2's exposed prefill, Σ #2 − variant's latency) over the questions both ran in one
    block with a known critical path."""
    pairs = [(r, ref) for r, ref in paired(rows, variant, REFERENCE) if ref.get("critical_path")]
    if not pairs:
        return None
    possible = sum(ref["critical_path"]["exposed_prefill"] for _, ref in pairs)
    realized = sum(ref["in_flight_s"] - r["in_flight_s"] for r, ref in pairs)
    return possible, realized


def _medians(rows: list[dict], key: str, fields: tuple[str, ...]) -> str:
    known = [r[key] for r in rows if r.get(key)]
    if not known:
        return "-"
    return " / ".join(f"{statistics.median(k[f] for k in known):.2f}" for f in fields)


def _router_load(rows: list[dict]) -> str:
    """The router's CPU seconds per question and event-loop lag p99 (ms), medians over the
    blocks (variant_blocks.warmup_fields; "-" for rows from before it measured them)."""
    blocks = {r["block"]: r for r in rows}.values()
    cpu = [b["router_cpu_s_per_q"] for b in blocks if "router_cpu_s_per_q" in b]
    lag = [b["router_lag_p99_s"] * 1e3 for b in blocks if "router_lag_p99_s" in b]
    return " / ".join(f"{statistics.median(v):.2f}" if v else "-" for v in (cpu, lag))


def report(rows: list[dict], meta: dict) -> str:
    lines = [
        "# The last warm-up timed to the last precursor's cap, against blocking",
        "",
        provenance(meta),
        "",
        (
            "| N | variant | questions | throughput q/s | in flight: mean / median / p90 s "
            f"| warm-ups per question | critical path, median s ({' / '.join(PARTS)}) "
            "| successors on it: tokens prefilled by the final request / send wait s, median "
            "| router CPU s per question / event-loop lag p99 ms, median of blocks |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ratios, gains = [], []
    for n in sorted({r["concurrency"] for r in rows}):
        at_n = [r for r in rows if r["concurrency"] == n]
        for variant in VARIANTS:
            mine = [r for r in at_n if r["variant"] == variant]
            if not mine:
                continue
            warm = statistics.mean(r["warmups"] for r in mine)
            lines.append(
                f"| {n} | {variant} | {len(mine)} | {throughput(mine):.4f} "
                f"| {latency_stats(mine, 'in_flight_s')} | {warm:.1f} "
                f"| {_medians(mine, 'critical_path', PARTS)} "
                f"| {_medians(mine, 'exposed_detail', DETAIL)} | {_router_load(mine)} |"
            )
        for variant in VARIANTS:
            if variant == REFERENCE or not any(r["variant"] == variant for r in at_n):
                continue
            ratios += ratio_lines(at_n, n, variant, REFERENCE)
            pairs = paired(at_n, variant, REFERENCE)
            same = sum(r["outputs"] == ref["outputs"] for r, ref in pairs)
            if (g := realized_over_possible(at_n, variant)) is not None:
                possible, realized = g
                share = f"{realized / possible:.2f}" if possible > 0 else "-"
                gains.append(
                    f"| {n} | {variant} | {realized:.1f} of {possible:.1f} s | {share} "
                    f"| {same} of {len(pairs)} |"
                )
    lines += [
        "",
        f"| N | variant | questions | n | ÷ {REFERENCE} per question, median [95% CI] | best | worst |",
        "|---|---|---|---|---|---|---|",
        *ratios,
        "",
        (
            "| N | variant | realized of possible (Σ over questions) | realized ÷ possible "
            f"| questions token-identical to {REFERENCE}, every agent |"
        ),
        "|---|---|---|---|---|",
        *gains,
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = block_arguments(__doc__.splitlines()[0], [1], 1, "runs/bench_warmup_timing")
    variants_argument(ap, VARIANTS, DEFAULT_VARIANTS)
    args = ap.parse_args()
    check_block_arguments(ap, args)
    variants = chosen_variants(ap, args, VARIANTS)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    questions = load_questions(args.dataset, args.offset + args.num_samples)[args.offset :]
    bench = BenchRun("benchmarks.bench_warmup_timing")
    overrides = {name: v.overrides for name, v in variants.items()}
    edits = {name: policy_edit(args.config, name) for name in EDITS if name in variants}
    # The deployment `moa-pd run --concurrency N` starts: the workers as the config has them.
    with (
        one_line_on_interrupt(out / "warmup_timing.jsonl"),
        routers_over_one_deployment(
            args.config, out, overrides, max(args.concurrency), False, edits
        ) as r,
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
                out / "warmup_timing.jsonl",
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
    (out / "bench_warmup_timing.md").write_text(text)


if __name__ == "__main__":
    main()
