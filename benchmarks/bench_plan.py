"""Issue 22's measured benchmark: a planned deployment (`moa-pd plan --profile`, started with
`moa-pd up --plan`) against the config's default deployment, both up at once and used in turn
(rounds of Q questions, the order swapped every round, the same questions on both), at
concurrency Q; throughput (questions ÷ a round's wall time) and median latency ratios, each
variant's measured numbers beside the simulator's prediction for it.

    python -m benchmarks.bench_plan --config tree_9_3_1_cpu --cpus 2 --concurrency 8 \
        --profile profiling/measured/cpu_2core_torch.json --rounds 2 --out runs/bench_plan
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from planning.plan_file import DeploymentPlan
from profiling.profile_file import Profile
from router.config_loader import load_config
from simulation.predict import predict_plan


def _moa(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "launch.cli", *args], check=True)


def _rows(out: Path) -> list[dict]:
    path = out / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _round(cluster: Path, config: str, conc: int, offset: int, out: Path) -> dict:
    """One round: the next Q questions at concurrency Q through `cluster`. Its wall time is the
    span of its questions (first start to last end), not the command's: the runner's own start
    (interpreter, tokenizer, dataset) is no part of the deployment's throughput."""
    before = {r["sample_id"] for r in _rows(out)}
    _moa(
        "run", "--config", config, "--dataset", "gsm8k", "--num-samples", str(conc + offset),
        "--concurrency", str(conc), "--settings", "3", "--cluster", str(cluster), "--out", str(out),
        "--resume",
    )  # fmt: skip
    mine = [r for r in _rows(out) if r["sample_id"] not in before and not r.get("error")]
    if not mine:
        raise SystemExit(f"round of {out} answered no question without error; see its results")
    wall = max(r["started_at"] + r["e2e_s"] for r in mine) - min(r["started_at"] for r in mine)
    return {"wall_s": wall, "e2e_s": [r["e2e_s"] for r in mine], "n": len(mine)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--cpus", default=str(os.cpu_count()))
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    conc = args.concurrency
    plan_path = out / "plan.json"
    _moa(
        "plan", "--config", args.config, "--cpus", args.cpus, "--concurrency", str(conc),
        "--profile", args.profile, "--out", str(plan_path),
    )  # fmt: skip
    deployments = {"planned": out / "deploy_planned", "default": out / "deploy_default"}
    _moa("up", "--plan", str(plan_path), "--run-dir", str(deployments["planned"]), "--detach")
    try:
        _moa(
            "up", "--config", args.config, "--concurrency", str(conc),
            "--run-dir", str(deployments["default"]), "--detach",
        )  # fmt: skip
        measured: dict[str, list[dict]] = {"planned": [], "default": []}
        for k in range(args.rounds):
            order = ["planned", "default"] if k % 2 == 0 else ["default", "planned"]
            for name in order:
                r = _round(
                    deployments[name] / "cluster.json", args.config, conc, k * conc, out / name
                )
                measured[name].append(r)
                print(f"round {k} {name}: {r['n']} questions in {r['wall_s']:.1f} s", flush=True)
    finally:
        for d in deployments.values():
            down = [sys.executable, "-m", "launch.cli", "down", "--run-dir", str(d)]
            subprocess.run(down, check=False)  # stop the other one even if this one is gone
    cfg, profile = load_config(args.config), Profile.load(args.profile)
    default_workers = sum(m.workers.prefill + m.workers.decode for m in cfg.models.values())
    plan = DeploymentPlan.load(plan_path)
    summary = {}
    for name, rounds in measured.items():
        trace = out / name
        pred = predict_plan(plan if name == "planned" else None, [cfg], profile, conc, trace=trace)
        summary[name] = {
            "throughput_qps": statistics.median(r["n"] / r["wall_s"] for r in rounds),
            "latency_median_s": statistics.median(x for r in rounds for x in r["e2e_s"]),
            "predicted": pred.model_dump(),
            "rounds": rounds,
        }
    p, d = summary["planned"], summary["default"]
    summary["ratios"] = {
        "throughput_planned_over_default": p["throughput_qps"] / d["throughput_qps"],
        "median_latency_planned_over_default": p["latency_median_s"] / d["latency_median_s"],
    }
    (out / "bench_plan.json").write_text(json.dumps(summary, indent=2) + "\n")
    lines = [
        (
            f"`{args.config}` at concurrency {conc}, {args.rounds} rounds, setting #3; workers: "
            f"planned {len(plan.workers)}, default {default_workers}"
        ),
        "",
        "| deployment | throughput q/s (pred.) | median latency s (pred.) |",
        "|---|---|---|",
    ]
    for name in ("planned", "default"):
        s = summary[name]
        lines.append(
            f"| {name} | {s['throughput_qps']:.4f} ({s['predicted']['throughput_qps']:.4f}) | "
            f"{s['latency_median_s']:.1f} ({s['predicted']['latency_median_s']:.1f}) |"
        )
    r = summary["ratios"]
    lines.append(
        f"\nplanned ÷ default: throughput {r['throughput_planned_over_default']:.3f}, "
        f"median latency {r['median_latency_planned_over_default']:.3f}"
    )
    (out / "bench_plan.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
