"""`moa-pd plot D`: rebuild D/summary.json, the comparison table and every figure from
D/results.jsonl alone (and Fig. 4(iii) from D/microbench.jsonl when a microbench wrote one)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from experiments.results import ResultsError, read_results


def rebuild(run_dir: str | Path, dpi: int = 150, print_table: bool = True) -> list[Path]:
    """Summary + figures for RUN_DIR; returns the files written."""
    from experiments.figures import plot_microbench, write_figures
    from experiments.summary import summarize, write_summary
    from experiments.summary_table import print_table as show

    run_dir = Path(run_dir)
    written: list[Path] = []
    results = run_dir / "results.jsonl"
    bench = run_dir / "microbench.jsonl"
    if results.exists() or not bench.exists():
        rows = read_results(results)
        summaries = summarize(rows)
        write_summary(summaries, run_dir / "summary.json", results.name)
        written.append(run_dir / "summary.json")
        if print_table:
            show(summaries)
        written += write_figures(rows, run_dir, dpi)
    if bench.exists():
        bench_rows = [json.loads(line) for line in bench.read_text().splitlines() if line.strip()]
        written.append(plot_microbench(bench_rows, run_dir / "fig_microbench.png", dpi))
    return written


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="D", help="a run folder holding results.jsonl")
    p.add_argument("--dpi", type=int, default=150, help="figure resolution (default 150)")


def main(args: argparse.Namespace) -> int:
    console = Console(stderr=True, soft_wrap=True)
    try:
        written = rebuild(args.run_dir, args.dpi)
    except ResultsError as e:
        console.print(f"[red]error:[/red] {e}")
        return 2
    for path in written:
        console.print(f"wrote {path}")
    return 0
