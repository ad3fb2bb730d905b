"""The warm-up isolation ladder (issue 11, item 1): how much each line of defence buys, on whole
questions. One worker deployment started with `--enable-priority-scheduling`, three shell routers
over it, and per question (order rotated, cold caches each time):

- `#2`: blocking (no warm-ups), the reference;
- `equal`: pipelined, no gate, no priority field (every request equal, FIFO on the worker);
- `priority`: pipelined, no gate, warm-ups sent with a lower SGLang `priority`;
- `gate`: pipelined, the router's PrefillGate plus priority, the gate looking at the prefill
  worker alone (the deployment before issue 19);
- `device`: pipelined, the gate also keeping a warm-up off a compute device whose slots busy
  workers fill (router/compute_device.py; the default deployment now).

Reports, per rung, the leaves' first-token time (the last leaf's), the last leaf's end (how much
warm-ups slowed decoding) and end-to-end latency as medians of per-question ratios to #2. Writes
OUT/ladder.jsonl and OUT/bench_gate_ladder.md.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_gate_ladder --num-samples 6 --offset 400 \
        --out runs/bench_ladder
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

import numpy as np

from benchmarks.bench_meta import BenchRun, provenance
from benchmarks.bench_overlap import log
from benchmarks.shell_routers import one_line_on_interrupt, routers_over_one_deployment
from experiments.datasets import load_questions
from experiments.paired_stats import median_ci
from experiments.prompts import build_question_prompt
from experiments.router_client import RouterClient
from experiments.run import flush_worker_caches

RUNGS = {  # name: (mode, cluster overrides)
    "#2": ("blocking", {"warmup_gate": True, "priority_scheduling": True}),
    "equal": ("pipelined", {"warmup_gate": False, "priority_scheduling": False}),
    "priority": ("pipelined", {"warmup_gate": False, "priority_scheduling": True}),
    "gate": (
        "pipelined",
        {"warmup_gate": True, "priority_scheduling": True, "warmup_gate_scope": "worker"},
    ),
    "device": (
        "pipelined",
        {"warmup_gate": True, "priority_scheduling": True, "warmup_gate_scope": "device"},
    ),
}


async def run(cluster: dict, urls: dict[str, str], cfg_name: str, questions, out: Path):
    rows = []
    with (out / "ladder.jsonl").open("w") as f:
        for i, q in enumerate(questions):
            rungs = list(urls)
            rungs = rungs[i % len(rungs) :] + rungs[: i % len(rungs)]
            for rung in rungs:
                async with RouterClient(urls[rung]) as client:
                    await flush_worker_caches(client, cluster)
                    t0 = time.perf_counter()
                    g = await client.run_graph(
                        build_question_prompt(q), q.id, cfg_name, RUNGS[rung][0], False
                    )
                    e2e = time.perf_counter() - t0
                leaves = [a for a in g["trace"].values() if not a["slot_order"]]
                row = {
                    "id": q.id,
                    "rung": rung,
                    "e2e_s": e2e,
                    "leaf_first_token_s": max(a["first_token_s"] for a in leaves),
                    "leaf_end_s": max(a["end_s"] for a in leaves),
                }
                rows.append(row)
                f.write(json.dumps(row) + "\n")
                log(
                    f"{q.id} {rung:9s} e2e {e2e:6.1f}s  last leaf first token "
                    f"{row['leaf_first_token_s']:5.2f}s"
                )
    return rows


def report(rows: list[dict], meta: dict) -> str:
    by = {(r["id"], r["rung"]): r for r in rows}
    ids = sorted({r["id"] for r in rows})
    lines = [
        (
            f"### Warm-up isolation ladder: {meta['config']}, GSM8K {ids[0]}..{ids[-1]} "
            f"({len(ids)} questions, CPU)"
        ),
        "",
        provenance(meta),
        "",
        "| rung | leaves' first token ÷ #2 | last leaf's end ÷ #2 | e2e ÷ #2 |",
        "|---|---|---|---|",
    ]
    for rung in [r for r in RUNGS if r != "#2" and any(x["rung"] == r for x in rows)]:
        cells = []
        for key in ("leaf_first_token_s", "leaf_end_s", "e2e_s"):
            xs = [
                by[(i, rung)][key] / by[(i, "#2")][key]
                for i in ids
                if (i, rung) in by and (i, "#2") in by
            ]
            m, lo, hi = median_ci(xs) if xs else (np.nan, np.nan, np.nan)
            cells.append(f"{m:.3f} [{lo:.3f}, {hi:.3f}]")
        lines.append(f"| {rung} | {' | '.join(cells)} |")
    lines += ["", "Medians of per-question ratios, [95% bootstrap CI]."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="tree_9_3_1_cpu")
    ap.add_argument("--num-samples", type=int, default=6)
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--out", default="runs/bench_ladder")
    ap.add_argument(
        "--rungs",
        default=",".join(RUNGS),
        help=f"comma-separated, from {', '.join(RUNGS)} (#2 is always run: the reference)",
    )
    args = ap.parse_args()
    rungs = ["#2"] + [r for r in args.rungs.split(",") if r and r != "#2"]
    unknown = sorted(set(rungs) - set(RUNGS))
    if unknown:
        ap.error(f"unknown rung(s) {', '.join(unknown)}; choose from {', '.join(RUNGS)}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    questions = load_questions("gsm8k", args.offset + args.num_samples)[args.offset :]
    bench = BenchRun("benchmarks.bench_gate_ladder")
    overrides = {rung: RUNGS[rung][1] for rung in rungs}
    with (
        one_line_on_interrupt(out / "ladder.jsonl"),
        routers_over_one_deployment(args.config, out, overrides) as r,
    ):
        rows = asyncio.run(run(r.cluster, r.urls, r.config_name, questions, out))
    meta = bench.meta(config=args.config)
    text = report(rows, meta)
    print(text)
    (out / "bench_gate_ladder.md").write_text(text)


if __name__ == "__main__":
    main()
