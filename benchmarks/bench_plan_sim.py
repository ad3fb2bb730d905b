"""Issue 22's simulated benchmark: the ILP's plan against the naive and greedy placements of one
topology, for several GPU counts and concurrencies, each plan scored by the simulator
(`simulation.predict.predict_plan`) with one profile. Writes a markdown table and a JSON file.

    python -m benchmarks.bench_plan_sim --config tree_9_3_1_dummy_gpu \
        --profile profiling/anchors/gpu_anchor_qwen3_h200.json --gpus 4x141GiB,8x141GiB \
        --concurrency 1,8,32 --out runs/bench_plan_sim
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from tqdm import tqdm

from planning.devices import cluster
from planning.ilp_plan import PlanRequest, plan_with_ilp
from planning.pack import HEADROOM_MIB
from profiling.profile_file import Profile
from router.config_loader import load_config
from simulation.predict import predict_plan


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--gpus", default="4x141GiB,8x141GiB", help="GPU counts per node, as plan")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--mode", choices=("replicate", "fixed"), default="replicate")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    profile = Profile.load(args.profile)
    cases = [
        (g, int(c)) for g in args.gpus.split(",") for c in args.concurrency.split(",") if c.strip()
    ]
    rows = []
    for gpus, conc in tqdm(cases, desc="plans", unit="case"):
        req = PlanRequest(
            [cfg],
            [args.config],
            profile,
            args.profile,
            cluster("gpu", gpus, 1, profile.device.memory_mib, profile.device.name),
            conc,
            args.mode,
            headroom_mib=HEADROOM_MIB,
        )
        scored = plan_with_ilp(req, predict_plan)
        row = {"gpus": gpus, "concurrency": conc, "solve_s": scored[0].plan.solver["seconds"]}
        for s in scored:
            p = s.prediction
            row[s.name] = (
                {"error": s.error}
                if p is None
                else {
                    "workers": len(s.plan.workers),
                    "median_s": p.latency_median_s,
                    "p90_s": p.latency_p90_s,
                    "qps": p.throughput_qps,
                }
            )
        rows.append(row)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_plan_sim.json").write_text(json.dumps(rows, indent=2) + "\n")
    md = [
        (
            f"config `{args.config}`, profile `{args.profile}`, mode {args.mode}; predicted by "
            "`simulation.predict.predict_plan` (32 questions, setting #3)"
        ),
        "",
        (
            "| GPUs | Q | solve s | plan: workers, median s, q/s | naive | greedy | "
            "plan ÷ naive q/s | plan ÷ greedy q/s |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]

    def cell(r: dict) -> str:
        if "error" in r:
            return "does not fit"
        return f"{r['workers']}, {r['median_s']:.2f}, {r['qps']:.3f}"

    def ratio(r: dict, base: str) -> str:
        b = r[base]
        return (
            "-" if "error" in b or "error" in r["plan"] else f"{r['plan']['qps'] / b['qps']:.2f}×"
        )

    for r in rows:
        md.append(
            f"| {r['gpus']} | {r['concurrency']} | {r['solve_s']:.2f} | {cell(r['plan'])} | "
            f"{cell(r['naive'])} | {cell(r['greedy'])} | {ratio(r, 'naive')} | "
            f"{ratio(r, 'greedy')} |"
        )
    (out / "bench_plan_sim.md").write_text("\n".join(md) + "\n")
    Console(soft_wrap=True).print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
