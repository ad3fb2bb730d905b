"""End-to-end early-exit benchmark (issue 5) on the CPU default: brings up a deployment of
tree_9_3_1_cpu (torch backend), runs GSM8K questions pipelined with early exit off and on,
interleaved per question (off, on, off, on, ...), and reports medians: time per EE decision, EE
time as a share of end-to-end latency, activation % per model and per agent layer, and latency
with vs without EE. Writes a markdown table to stdout and to OUT/bench_early_exit_e2e.md.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python -m experiments.bench_early_exit_e2e \
        --num-samples 20 --out runs/bench_ee
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

from experiments.datasets import load_questions
from experiments.prompts import build_question_prompt
from experiments.router_client import RouterClient
from launch.commands import bring_up, make_stack
from router.config_loader import load_config
from router.early_exit import activation_percentage


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def layer_activation(traces: list[dict]) -> dict[int, float]:
    """% of each layer's planned agent runs that were used (completed, not killed/bypassed)."""
    planned: dict[int, int] = {}
    used: dict[int, int] = {}
    for t in traces:
        for e in t.values():
            planned[e["layer"]] = planned.get(e["layer"], 0) + 1
            ok = not e.get("killed") and not e.get("skipped") and not e.get("error")
            used[e["layer"]] = used.get(e["layer"], 0) + int(ok)
    return {k: 100.0 * used[k] / planned[k] for k in sorted(planned)}


async def run_all(url: str, config: str, questions, budget_s: float, log) -> list[dict]:
    rows: list[dict] = []
    start = time.perf_counter()
    async with RouterClient(url) as client:
        # Untimed warm-up: loads the embedder in the router and warms the workers.
        for ee in (True, False):
            await client.run_graph("What is 1 + 1?", "warmup", config, "pipelined", ee)
        for i, q in enumerate(questions):
            if time.perf_counter() - start > budget_s:
                log(f"time budget {budget_s:.0f}s spent after {i} questions; stopping")
                break
            for ee in (False, True):
                t0 = time.perf_counter()
                out = await client.run_graph(
                    build_question_prompt(q), q.id, config, "pipelined", ee
                )
                e2e = time.perf_counter() - t0
                rows.append(
                    {
                        "id": q.id,
                        "ee": ee,
                        "e2e_s": e2e,
                        "trace": out["trace"],
                        "early_exit": out["early_exit"],
                    }
                )
                n_exit = sum(d["exited"] for d in out["early_exit"])
                log(f"{q.id} ee={'on ' if ee else 'off'} {e2e:6.1f}s exits={n_exit}")
    return rows


def report(rows: list[dict], cfg, args, device: str) -> str:
    on = [r for r in rows if r["ee"]]
    off = [r for r in rows if not r["ee"]]
    ids_done = sorted({r["id"] for r in on} & {r["id"] for r in off})
    decisions = [d for r in on for d in r["early_exit"]]
    computed = [d for d in decisions if d["q"] is not None]
    share = [100.0 * sum(d["seconds"] for d in r["early_exit"]) / r["e2e_s"] for r in on]
    models = {a.id: a.model for a in cfg.agents}
    act = activation_percentage([r["trace"] for r in on], models)
    layers = layer_activation([r["trace"] for r in on])
    exits = sum(d["exited"] for d in decisions)
    killed = sum(len(d["killed"]) for d in decisions)
    lat_off, lat_on = median([r["e2e_s"] for r in off]), median([r["e2e_s"] for r in on])
    lines = [
        f"### Early exit end to end: {cfg.name}, GSM8K, pipelined ({device})",
        "",
        (
            f"{len(ids_done)} questions ({ids_done[0] if ids_done else '-'} .. "
            f"{ids_done[-1] if ids_done else '-'}), EE off/on interleaved per question; "
            f"max_new_tokens {cfg.sampling.max_new_tokens}, method {cfg.early_exit.method}, "
            f"tau {cfg.early_exit.tau}, exponent {cfg.early_exit.exponent}, "
            f"min_completed {cfg.early_exit.min_completed}, embedder "
            f"{cfg.early_exit.embedding_model}."
        ),
        "",
        "| metric | value |",
        "|---|---|",
        f"| EE decisions (all / with Q computed) | {len(decisions)} / {len(computed)} |",
        (
            "| time per EE decision, median (ms), all / with Q | "
            f"{1e3 * median([d['seconds'] for d in decisions]):.2f} / "
            f"{1e3 * median([d['seconds'] for d in computed]):.2f} |"
        ),
        (
            "| time per EE decision, max (ms) | "
            f"{1e3 * max((d['seconds'] for d in decisions), default=float('nan')):.2f} |"
        ),
        f"| EE time / e2e latency, median per question (%) | {median(share):.2f} |",
        f"| EE time / e2e latency, max per question (%) | {max(share, default=float('nan')):.2f} |",
        f"| exits / agents killed (over all questions) | {exits} / {killed} |",
        *[f"| activation %, model {m} | {v:.1f} |" for m, v in act.items()],
        *[f"| activation %, layer {k} | {v:.1f} |" for k, v in layers.items()],
        f"| e2e latency median, EE off (s) | {lat_off:.2f} |",
        f"| e2e latency median, EE on (s) | {lat_on:.2f} |",
        f"| latency ratio on/off (ratio of medians) | {lat_on / lat_off:.3f} |",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="tree_9_3_1_cpu")
    ap.add_argument("--num-samples", type=int, default=20)
    ap.add_argument("--out", default="runs/bench_early_exit_e2e")
    ap.add_argument("--run-dir", default=None, help="deployment logs (default OUT/deploy)")
    ap.add_argument(
        "--budget-s", type=float, default=900.0, help="stop starting questions after this"
    )
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = load_config(args.config)
    questions = load_questions("gsm8k", args.num_samples)

    def log(msg: str) -> None:
        print(msg, flush=True)

    stack = make_stack([args.config], "torch", Path(args.run_dir or out / "deploy"), "127.0.0.1")
    try:
        cluster = bring_up(stack)
        rows = asyncio.run(
            run_all(cluster["shell_router_url"], cfg.name, questions, args.budget_s, log)
        )
    finally:
        stack.down()
    with open(out / "bench_early_exit_e2e.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    device = f"CPU, torch backend, {os.cpu_count()} cores shared"
    text = report(rows, cfg, args, device)
    print(text)
    (out / "bench_early_exit_e2e.md").write_text(text)


if __name__ == "__main__":
    main()
