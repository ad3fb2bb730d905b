"""End-to-end benchmark of dependency-aware overlap: setting #3 (tree, pipelined) against #2 (tree,
blocking) on whole questions, both variants interleaved in one run, on cold caches.

- Concurrency 1: every question runs in both settings back to back, in alternating order
  (#2 #3, then #3 #2, ...), each on freshly flushed worker caches.
- Concurrency 4: the questions in blocks of 8, four in flight; blocks alternate the settings'
  order (A: #2 #3, B: #3 #2, ...). Throughput is questions per second of each block's wall time.

Reports medians of paired per-question ratios (with a 95% bootstrap interval), the last leaf's end
time, the successors' wait from final request to first token, the critical-path breakdown and the
realized share of the possible gain (experiments/critical_path.py), and whether both settings gave
the same final answer tokens. Rows go to OUT/results.jsonl (concurrency 1; `moa-pd plot OUT` draws
the timeline) and OUT/results_c4.jsonl as they come, each block's wall time to OUT/c4_blocks.json,
and the report to OUT/bench_overlap.md and stdout. A run stopped midway keeps what it measured:
`--report-only --out OUT` writes the report from it.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_overlap --num-samples 20 --offset 400 \
        --c4-samples 16 --out runs/bench_overlap
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

from benchmarks.bench_meta import BenchRun, cpu_device, provenance
from experiments.critical_path import PARTS, gain_by_part, median_breakdown, overlap_gain
from experiments.datasets import Question, load_questions
from experiments.paired_stats import median_ci
from experiments.prompts import build_question_prompt
from experiments.results import ResultRow, ResultsWriter, read_results
from experiments.router_client import RouterClient
from experiments.run import flush_worker_caches, result_row
from experiments.settings import SETTINGS
from experiments.speed_reference import STEADY_BAND, speed_ratios, steady
from launch.commands import bring_up, make_stack
from planning.placement import PlacementOptions
from router.config_loader import load_config

BLOCKING, PIPELINED = SETTINGS[2], SETTINGS[3]
# What a run leaves in --out as it goes: rows at concurrency 1 and under load, each block's wall
# time, and the metadata (completed at the end); the report is rebuilt from them.
RUN_FILES = ("results.jsonl", "results_c4.jsonl")
BLOCKS_FILE = "c4_blocks.json"
META_FILE = "bench_meta.json"


def log(msg: str) -> None:
    print(msg, flush=True)


async def run_one(client: RouterClient, cfg_name: str, q: Question, setting) -> dict:
    t0 = time.perf_counter()
    graph = await client.run_graph(build_question_prompt(q), q.id, cfg_name, setting.mode, False)
    return result_row(q, setting, cfg_name, graph, None, time.perf_counter() - t0)


async def concurrency_1(client, cluster, cfg_name, questions, writer) -> None:
    for i, q in enumerate(questions):
        order = (BLOCKING, PIPELINED) if i % 2 == 0 else (PIPELINED, BLOCKING)
        rows = {}
        for setting in order:
            await flush_worker_caches(client, cluster)
            row = await run_one(client, cfg_name, q, setting)
            writer.append(row)
            rows[setting.number] = ResultRow.model_validate(row)
        e2e = {s: r.e2e_s for s, r in rows.items()}
        speed = speed_ratios(list(rows.values()), 3, 2).get(q.id)
        log(
            f"c1 {q.id}: #2 {e2e[2]:6.1f}s  #3 {e2e[3]:6.1f}s  ratio {e2e[3] / e2e[2]:.3f}"
            + (f"  (final decode #3 ÷ #2 {speed:.2f})" if speed is not None else "")
        )


async def concurrency_n(
    client, cluster, cfg_name, questions, writer, n: int, block: int, blocks_path: Path
) -> list[dict]:
    """Blocks of `block` questions with `n` in flight; returns one record per (block, setting),
    each also written to `blocks_path` as soon as its block ends."""
    records = []
    blocks = [questions[i : i + block] for i in range(0, len(questions), block)]
    for b, qs in enumerate(blocks):
        order = (BLOCKING, PIPELINED) if b % 2 == 0 else (PIPELINED, BLOCKING)
        for setting in order:
            await flush_worker_caches(client, cluster)
            sem = asyncio.Semaphore(n)

            async def one(q, setting=setting, sem=sem):
                async with sem:
                    return await run_one(client, cfg_name, q, setting)

            t0 = time.perf_counter()
            rows = await asyncio.gather(*(one(q) for q in qs))
            wall = time.perf_counter() - t0
            for row in rows:
                writer.append({**row, "block": b})
            records.append(
                {"block": b, "setting": setting.number, "questions": len(qs), "wall_s": wall}
            )
            blocks_path.write_text(json.dumps(records, indent=1))
            log(f"c{n} block {b} #{setting.number}: {len(qs)} questions in {wall:.1f}s")
    return records


# --- report -------------------------------------------------------------------------------------
def paired_by_question(rows: list[ResultRow], metric) -> dict[str, float]:
    """Per question both ran, metric(#3 row) / metric(#2 row)."""
    by = {(r.sample_id, r.setting): r for r in rows if r.ok}
    out = {}
    for (sid, s), r3 in by.items():
        r2 = by.get((sid, 2))
        if s == 3 and r2 is not None and (m2 := metric(r2)) and (m3 := metric(r3)) is not None:
            out[sid] = m3 / m2
    return out


def paired(rows: list[ResultRow], metric) -> list[float]:
    return list(paired_by_question(rows, metric).values())


def last_leaf_end(r: ResultRow) -> float | None:
    ends = [a.end_s for a in r.agents.values() if not a.slot_order and a.end_s is not None]
    return max(ends) if ends else None


def successor_wait(r: ResultRow) -> float | None:
    """Σ over successors of final request → first token."""
    waits = [
        a.first_token_s - a.final_request_s
        for a in r.agents.values()
        if a.slot_order and a.first_token_s is not None and a.final_request_s is not None
    ]
    return sum(waits) if waits else None


def same_final_tokens(rows: list[ResultRow]) -> tuple[int, int]:
    by = {(r.sample_id, r.setting): r for r in rows if r.ok}
    pairs = [(r, by[(sid, 2)]) for (sid, s), r in by.items() if s == 3 and (sid, 2) in by]
    same = sum(
        all(a.output_ids == b.agents[k].output_ids for k, a in r3.agents.items()) for r3, b in pairs
    )
    return same, len(pairs)


def fmt_ci(xs: list[float]) -> str:
    if not xs:
        return "-"
    m, lo, hi = median_ci(xs)
    return f"**{m:.3f}** [{lo:.3f}, {hi:.3f}]"


def _concurrency_1_lines(c1: list[ResultRow]) -> list[str]:
    e2e = paired(c1, lambda r: r.e2e_s)
    gain = overlap_gain(c1, c1[0].dataset, 3, 2)
    same, n_pairs = same_final_tokens(c1)
    lines = [
        "| concurrency 1 (paired per question, #3 ÷ #2) | median [95% CI] |",
        "|---|---|",
        f"| end-to-end latency ({len(e2e)} questions) | {fmt_ci(e2e)} |",
        (
            f"| questions with ratio > 1.05 | {sum(x > 1.05 for x in e2e)} "
            f"(max {max(e2e, default=float('nan')):.3f}) |"
        ),
        f"| last leaf's end | {fmt_ci(paired(c1, last_leaf_end))} |",
        (
            "| successors' wait, final request → first token | "
            f"{fmt_ci(paired(c1, successor_wait))} |"
        ),
    ]
    if gain:
        lines.append(
            f"| realized ÷ possible gain (Σ over questions) | "
            f"**{gain.realized_over_possible:.2f}** ({gain.realized_s:.1f} s of "
            f"{gain.possible_s:.1f} s) |"
        )
    if moved := gain_by_part(c1, 3, 2):
        layers = sorted(k for k in moved if k.startswith("decode_layer_"))
        per_layer = ", ".join(f"layer {k.rsplit('_', 1)[1]} {moved[k]:+.1f}" for k in layers)
        lines.append(
            "| Σ #3 − #2 on each one's critical path, s | "
            + ", ".join(f"{k} {moved[k]:+.1f}" for k in PARTS)
            + f" (decode: {per_layer}) |"
        )
    lines.append(f"| identical tokens, every agent, #2 vs #3 | {same} of {n_pairs} questions |")
    lines += _speed_reference_lines(c1)
    for s in (2, 3):
        b = median_breakdown([r for r in c1 if r.setting == s])
        if b:
            parts = ", ".join(f"{k} {v:.2f}" for k, v in b.items())
            lines.append(f"| critical path #{s}, median s | {parts} |")
    return lines


def _speed_reference_lines(c1: list[ResultRow]) -> list[str]:
    """The machine's drift within each pair (experiments/speed_reference.py) and the end-to-end
    ratio over the pairs it left steady."""
    speed = speed_ratios(c1, 3, 2)
    if not speed:
        return []
    e2e = paired_by_question(c1, lambda r: r.e2e_s)
    calm_e2e = [e2e[sid] for sid in steady(speed) if sid in e2e]
    return [
        (
            "| final agent's decode, same tokens and alone (the machine's own drift) | "
            f"{fmt_ci(list(speed.values()))}, range {min(speed.values()):.2f}–"
            f"{max(speed.values()):.2f} |"
        ),
        (
            f"| end-to-end latency on the pairs it moved ≤ {STEADY_BAND:.0%} "
            f"({len(calm_e2e)} of {len(speed)}) | {fmt_ci(calm_e2e)} |"
        ),
    ]


def report(c1: list[ResultRow], c4: list[ResultRow], c4_blocks: list[dict], meta: dict) -> str:
    lines = [
        (
            f"### Overlap end to end: {meta['config']}, {meta['dataset']} "
            f"questions {meta['first']}..{meta['last']} ({meta['device']})"
        ),
        "",
        provenance(meta),
        "",
    ]
    if c1:  # --num-samples 0 runs concurrency 4 alone
        lines += _concurrency_1_lines(c1)
    both = {b["block"] for b in c4_blocks if b["setting"] == 2} & {
        b["block"] for b in c4_blocks if b["setting"] == 3
    }
    c4_blocks = [b for b in c4_blocks if b["block"] in both]  # a stopped run's last may lack one
    if c4_blocks:
        tput = {
            s: sum(b["questions"] for b in c4_blocks if b["setting"] == s)
            / sum(b["wall_s"] for b in c4_blocks if b["setting"] == s)
            for s in (2, 3)
        }
        lat = paired(c4, lambda r: r.e2e_s)
        lines += [
            "",
            (
                f"| concurrency {meta['c4']} ({len(lat)} questions, blocks of "
                f"{meta['block']}) | value |"
            ),
            "|---|---|",
            f"| throughput #2 / #3 (questions/s) | {tput[2]:.4f} / {tput[3]:.4f} |",
            f"| throughput #3 ÷ #2 | **{tput[3] / tput[2]:.3f}** |",
            f"| latency #3 ÷ #2, median of paired ratios [95% CI] | {fmt_ci(lat)} |",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="tree_9_3_1_cpu")
    ap.add_argument("--dataset", default="gsm8k")
    ap.add_argument("--num-samples", type=int, default=20, help="questions at concurrency 1")
    ap.add_argument("--offset", type=int, default=0, help="skip the dataset's first N questions")
    ap.add_argument("--c4-samples", type=int, default=16, help="questions under load (0: skip)")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--block", type=int, default=8, help="questions per block under load")
    ap.add_argument("--pin-cpus", action="store_true")
    ap.add_argument("--out", default="runs/bench_overlap")
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: write the report from the rows already in --out (a run stopped midway)",
    )
    args = ap.parse_args()
    out = Path(args.out)
    if args.report_only:
        write_report(out, *read_run(out, ap.error))
        return
    if not (args.num_samples or args.c4_samples):
        ap.error("--num-samples and --c4-samples are both 0: nothing to run")
    if "," in args.dataset:
        ap.error("--dataset: one dataset (its overlap gain is reported per dataset), not a mix")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out.mkdir(parents=True, exist_ok=True)
    cfg = load_config(args.config)
    n = args.offset + max(args.num_samples, args.c4_samples)
    questions = load_questions(args.dataset, n)[args.offset :]
    bench = BenchRun("benchmarks.bench_overlap")
    about = {
        "config": cfg.name,
        "dataset": args.dataset,
        "first": questions[0].id,
        "last": questions[-1].id,
        "c4": args.concurrency,
        "block": args.block,
        "device": cpu_device(args.pin_cpus),
    }
    # Started as `moa-pd up --concurrency N` would: pools and decode slots for N in flight.
    stack = make_stack(
        [args.config],
        "torch",
        out / "deploy",
        "127.0.0.1",
        args.pin_cpus,
        placement=PlacementOptions(concurrency=args.concurrency),
    )
    for name in (*RUN_FILES, BLOCKS_FILE, "bench_overlap.md"):
        (out / name).unlink(missing_ok=True)
    (out / META_FILE).write_text(json.dumps(bench.started(**about), indent=1))
    try:
        cluster = bring_up(stack)
        asyncio.run(_run(cluster, cfg.name, questions, args, out))
    finally:
        stack.down()
    (out / META_FILE).write_text(json.dumps(bench.meta(**about), indent=1))
    write_report(out, *read_run(out, ap.error))


def read_run(out: Path, fail) -> tuple[list[ResultRow], list[ResultRow], list[dict], dict]:
    """(concurrency-1 rows, rows under load, block records, metadata) of the run in `out`;
    `fail(message)` when it holds nothing to report."""
    if not (out / META_FILE).is_file() or not any((out / f).is_file() for f in RUN_FILES):
        fail(
            f"{out}: no benchmark run to report (it needs {META_FILE} and "
            f"{' or '.join(RUN_FILES)}, which `python -m benchmarks.bench_overlap --out {out}` "
            "writes)"
        )
    c1, c4 = ((read_results(out / f) if (out / f).is_file() else []) for f in RUN_FILES)
    blocks = json.loads((out / BLOCKS_FILE).read_text()) if (out / BLOCKS_FILE).is_file() else []
    return c1, c4, blocks, json.loads((out / META_FILE).read_text())


def write_report(out: Path, c1, c4, blocks, meta) -> None:
    text = report(c1, c4, blocks, meta)
    print(text)
    (out / "bench_overlap.md").write_text(text)


async def _run(cluster: dict, cfg_name: str, questions: list[Question], args, out: Path) -> None:
    async with RouterClient(cluster["shell_router_url"]) as client:
        # Untimed: loads tokenizers in the router and warms the workers' code paths.
        await run_one(
            client, cfg_name, Question("warmup", "What is 1 + 1?", "2", "gsm8k"), PIPELINED
        )
        await concurrency_1(
            client,
            cluster,
            cfg_name,
            questions[: args.num_samples],
            ResultsWriter(out / RUN_FILES[0]),
        )
        if args.c4_samples:
            await concurrency_n(
                client,
                cluster,
                cfg_name,
                questions[: args.c4_samples],
                ResultsWriter(out / RUN_FILES[1]),
                args.concurrency,
                args.block,
                out / BLOCKS_FILE,
            )


if __name__ == "__main__":
    main()
