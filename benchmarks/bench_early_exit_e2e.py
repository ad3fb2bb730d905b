"""End-to-end early-exit benchmark on the CPU default: brings up a deployment of tree_9_3_1_cpu
(torch backend) and runs GSM8K questions pipelined with early exit off and on. Every measurement
starts on cold caches (every worker's prefix cache flushed first), and the order alternates per
question (off, on | on, off | ...), so neither variant reuses the other's KV or always runs
second. Reports the median of the paired per-question latency ratios on ÷ off with a 95%
bootstrap CI, the exit rate (moot exits apart), both accuracies with McNemar's exact p, and early
exit's overhead: decision compute ÷ e2e, and exiting decisions' wall time (their delay on the
critical path) ÷ e2e. Writes OUT/bench_early_exit_e2e.{jsonl,md}.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python -m benchmarks.bench_early_exit_e2e \\
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

from benchmarks.bench_meta import BenchRun, cpu_device, provenance
from experiments.datasets import load_questions
from experiments.paired_stats import bootstrap_ci, mcnemar
from experiments.prompts import build_question_prompt
from experiments.router_client import RouterClient
from experiments.run import flush_worker_caches
from experiments.scoring import score
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


async def run_all(cluster: dict, config: str, questions, budget_s: float, log) -> list[dict]:
    rows: list[dict] = []
    start = time.perf_counter()
    async with RouterClient(cluster["shell_router_url"]) as client:
        # Untimed warm-up of the code paths (the embedder is already loaded at start-up).
        for ee in (True, False):
            await client.run_graph("What is 1 + 1?", "warmup", config, "pipelined", ee)
        for i, q in enumerate(questions):
            if time.perf_counter() - start > budget_s:
                log(f"time budget {budget_s:.0f}s spent after {i} questions; stopping")
                break
            for ee in (False, True) if i % 2 == 0 else (True, False):
                await flush_worker_caches(client, cluster)  # cold caches for every measurement
                t0 = time.perf_counter()
                out = await client.run_graph(
                    build_question_prompt(q), q.id, config, "pipelined", ee, q.dataset
                )
                e2e = time.perf_counter() - t0
                graded = score(q, out["answer"])
                rows.append(
                    {
                        "id": q.id,
                        "ee": ee,
                        "first": ee == (i % 2 == 1),
                        "e2e_s": e2e,
                        "correct": graded.correct,
                        "answer": graded.extracted,
                        "trace": out["trace"],
                        "early_exit": out["early_exit"],
                    }
                )
                n_exit = sum(d["exited"] for d in out["early_exit"])
                log(
                    f"{q.id} ee={'on ' if ee else 'off'} {e2e:6.1f}s exits={n_exit} "
                    f"correct={graded.correct}"
                )
    return rows


def _ci(ci) -> str:
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "-"


def report(rows: list[dict], cfg, meta: dict) -> str:
    on = {r["id"]: r for r in rows if r["ee"]}
    off = {r["id"]: r for r in rows if not r["ee"]}
    ids = [i for i in on if i in off]
    ratios = [on[i]["e2e_s"] / off[i]["e2e_s"] for i in ids]
    decisions = [d for i in ids for d in on[i]["early_exit"]]
    drawn = [d for d in decisions if d["q"] is not None and not d.get("moot")]
    exits = [d for d in decisions if d["exited"]]
    moot = sum(bool(d.get("moot")) for d in decisions)
    compute = [100 * sum(d["seconds"] for d in on[i]["early_exit"]) / on[i]["e2e_s"] for i in ids]
    critical = [
        100 * sum(d["wall_s"] for d in on[i]["early_exit"] if d["exited"]) / on[i]["e2e_s"]
        for i in ids
    ]
    total_on = sum(on[i]["e2e_s"] for i in ids)
    pooled_compute = 100 * sum(d["seconds"] for d in decisions) / total_on if ids else float("nan")
    pooled_critical = 100 * sum(d["wall_s"] for d in exits) / total_on if ids else float("nan")
    acc_on = [bool(on[i]["correct"]) for i in ids]
    acc_off = [bool(off[i]["correct"]) for i in ids]
    test = mcnemar(acc_on, acc_off)
    models = {a.id: a.model for a in cfg.agents}
    act = activation_percentage([on[i]["trace"] for i in ids], models)
    layers = layer_activation([on[i]["trace"] for i in ids])
    ee = cfg.early_exit
    lines = [
        f"### Early exit end to end: {cfg.name}, GSM8K, pipelined ({meta['device']})",
        "",
        (
            f"{len(ids)} questions ({ids[0] if ids else '-'} .. {ids[-1] if ids else '-'}); every "
            "measurement on cold caches (all workers flushed first), EE off/on order alternating "
            f"per question; max_new_tokens {cfg.sampling.max_new_tokens} (leaves 48/96/160), method "
            f"{ee.method}, tau {ee.tau}, exponent {ee.exponent}, min_completed {ee.min_completed}, "
            f"embedder {ee.embedding_model}."
        ),
        "",
        provenance(meta),
        "",
        "| metric | value |",
        "|---|---|",
        (
            f"| **latency EE on ÷ off**, median of paired per-question ratios [95% bootstrap CI] | "
            f"**{median(ratios):.3f}** {_ci(bootstrap_ci(ratios))} |"
        ),
        (
            f"| e2e latency median, EE off / on (s) | "
            f"{median([off[i]['e2e_s'] for i in ids]):.2f} / "
            f"{median([on[i]['e2e_s'] for i in ids]):.2f} |"
        ),
        (
            f"| ratio when off ran first / when on ran first (medians) | "
            f"{median([r for r, i in zip(ratios, ids) if not on[i]['first']]):.3f} / "
            f"{median([r for r, i in zip(ratios, ids) if on[i]['first']]):.3f} |"
        ),
        (
            f"| EE decisions: all / drew a Q / exits / moot | {len(decisions)} / "
            f"{len(drawn) + moot} / {len(exits)} / {moot} |"
        ),
        (
            f"| **exit rate** (exits ÷ decisions that drew, moot left out) | "
            f"**{100 * len(exits) / len(drawn) if drawn else float('nan'):.1f}%** |"
        ),
        f"| agents killed | {sum(len(d['killed']) for d in exits)} |",
        (
            f"| accuracy EE off / on | {100 * sum(acc_off) / len(ids):.0f}% / "
            f"{100 * sum(acc_on) / len(ids):.0f}% (only on correct {test.only_a}, only off "
            f"{test.only_b}, McNemar exact p = {test.p_value:.2f}) |"
        ),
        (
            f"| EE decision compute ÷ e2e: pooled / median per question / max | "
            f"{pooled_compute:.2f}% / {median(compute):.2f}% / {max(compute, default=float('nan')):.2f}% |"
        ),
        (
            f"| **EE on the critical path** (exiting decisions' wall time ÷ e2e): pooled / median / max"
            f" | **{pooled_critical:.2f}%** / {median(critical):.2f}% / "
            f"{max(critical, default=float('nan')):.2f}% |"
        ),
        (
            f"| time per decision that drew, median / max (ms) | "
            f"{1e3 * median([d['seconds'] for d in drawn]):.1f} / "
            f"{1e3 * max((d['seconds'] for d in drawn), default=float('nan')):.1f} |"
        ),
        *[f"| activation %, model {m} | {v:.1f} |" for m, v in act.items()],
        *[f"| activation %, layer {k} | {v:.1f} |" for k, v in layers.items()],
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="tree_9_3_1_cpu")
    ap.add_argument("--num-samples", type=int, default=20)
    ap.add_argument("--out", default="runs/bench_early_exit_e2e")
    ap.add_argument("--run-dir", default=None, help="deployment logs (default OUT/deploy)")
    ap.add_argument(
        "--budget-s", type=float, default=1800.0, help="stop starting questions after this"
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

    bench = BenchRun("benchmarks.bench_early_exit_e2e")
    stack = make_stack([args.config], "torch", Path(args.run_dir or out / "deploy"), "127.0.0.1")
    try:
        cluster = bring_up(stack)
        rows = asyncio.run(run_all(cluster, cfg.name, questions, args.budget_s, log))
    finally:
        stack.down()
    meta = bench.meta(device=cpu_device())
    with open(out / "bench_early_exit_e2e.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    text = report(rows, cfg, meta)
    print(text)
    (out / "bench_early_exit_e2e.md").write_text(text)


if __name__ == "__main__":
    main()
