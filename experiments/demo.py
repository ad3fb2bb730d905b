"""`moa-pd demo` (what `make demo` runs): the CPU default end to end. Brings up SmolLM2-135M
prefill/decode pairs behind the real sglang-router, runs a few GSM8K questions through the
paper's settings #1-#4, prints the comparison table, writes figures, and tears everything down."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from rich.console import Console

DEMO_DIR = Path("runs/demo")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-samples", type=int, default=3, help="GSM8K questions (default 3)")
    p.add_argument("--out", default=str(DEMO_DIR), help=f"run folder (default {DEMO_DIR})")
    p.add_argument("--config", default="tree_9_3_1_cpu")
    p.add_argument("--dense-config", default="all_to_all_9_9_1_cpu")


def main(args: argparse.Namespace) -> int:
    from experiments.run import RunSpec, run_experiment
    from experiments.settings import parse_settings

    console = Console(stderr=True, soft_wrap=True)
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)  # a demo always starts fresh; real runs use `moa-pd run --resume`
    console.rule("moa-pd demo")
    console.print(
        f"{args.num_samples} GSM8K questions x settings #1-#4: dense 9-9-1 blocking, "
        "tree 9-3-1 blocking, tree pipelined, tree pipelined + early exit"
    )
    spec = RunSpec(
        args.config, args.dense_config, "gsm8k", args.num_samples, parse_settings("1,2,3,4"), 1, out
    )
    written = run_experiment(spec)
    console.rule("done")
    for path in written:
        console.print(f"wrote {path}")
    console.print(f"per-sample rows with every agent's trace: {out / 'results.jsonl'}")
    return 0
