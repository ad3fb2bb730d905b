"""`moa-pd sweep SPEC.json`: one run per config × dataset × chunk policy (each running the spec's
settings on the same questions), then one `sweep.csv` row per (run, setting) and one table."""

from __future__ import annotations

import argparse
import csv
import logging
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from experiments.results import read_results
from experiments.summary import SettingSummary, summarize
from experiments.sweep_spec import SweepSpec, config_with_chunk_policy, load_spec

log = logging.getLogger(__name__)


@dataclass(slots=True)
class SweepJob:
    """One run of a sweep: what the runner needs, and where its results.jsonl must land."""

    config: str  # the tree config path to use (a chunk-policy copy when the sweep rewrote it)
    dense_config: str | None
    dataset: str
    settings: list[int]
    chunk_policy: str
    num_samples: int | None
    concurrency: int
    out_dir: Path
    backend: str = "torch"
    cluster: str | None = None
    resume: bool = False
    routed_config: str | None = None


# The runner: runs a job, leaving job.out_dir/results.jsonl. Tests pass a fake.
Runner = Callable[[SweepJob], object]


def run_with_experiments_run(job: SweepJob) -> object:
    """The real runner: experiments.run.run_experiment with the job's settings."""
    from experiments.run import RunSpec, run_experiment
    from experiments.settings import SETTINGS

    return run_experiment(
        RunSpec(
            tree_config=job.config,
            dense_config=job.dense_config,
            dataset=job.dataset,
            num_samples=job.num_samples,
            settings=[SETTINGS[s] for s in job.settings],
            concurrency=job.concurrency,
            out_dir=job.out_dir,
            cluster_path=Path(job.cluster) if job.cluster else None,
            resume=job.resume,
            backend=job.backend,
            routed_config=job.routed_config,
        )
    )


def _slug(text: str) -> str:
    """A folder name: a config or dataset file's stem, or the text with odd characters as _;
    a dataset mix (a,b): its members' slugs joined by +."""
    if "," in text:
        return "+".join(_slug(member) for member in text.split(","))
    name = Path(text).stem if text.endswith((".json", ".jsonl")) else text
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def plan_jobs(spec: SweepSpec, resume: bool = False) -> list[SweepJob]:
    """Every combination, in spec order, each with its own run dir under spec.out."""
    return [
        SweepJob(
            config=config,
            dense_config=spec.dense_config,
            dataset=dataset,
            settings=list(spec.settings),
            chunk_policy=policy,
            num_samples=spec.num_samples,
            concurrency=spec.concurrency,
            out_dir=Path(spec.out) / _slug(config) / _slug(dataset) / _slug(policy),
            backend=spec.backend,
            cluster=spec.cluster,
            resume=resume,
            routed_config=spec.routed_config,
        )
        for config in spec.configs
        for dataset in spec.datasets
        for policy in spec.chunk_policies
    ]


def csv_row(job: SweepJob, summary: SettingSummary | None, status: str) -> dict:
    base = {
        "config": _slug(job.config),
        "dataset": job.dataset,
        "chunk_policy": job.chunk_policy,
        "status": status,
        "run_dir": str(job.out_dir),
    }
    if summary is None:
        return base
    values = asdict(summary)
    values.pop("dataset")
    values.pop("config")
    values.pop("chunk_policy")
    values["activation_pct"] = ";".join(
        f"{m}={v:.1f}" for m, v in sorted(summary.activation_pct.items())
    )
    return {**base, **values}


def csv_columns() -> list[str]:
    skip = {"dataset", "config", "chunk_policy"}
    return ["config", "dataset", "chunk_policy", "status", "run_dir"] + [
        f.name for f in fields(SettingSummary) if f.name not in skip
    ]


def write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=csv_columns(), restval="")
        writer.writeheader()
        writer.writerows(rows)


def run_sweep(
    spec: SweepSpec, runner: Runner, resume: bool = False, fail_fast: bool = False
) -> list[dict]:
    """Run every job, rewriting OUT/sweep.csv after each so an interrupted sweep keeps what it
    has; a failed job gets one row with status 'error: ...' and the sweep goes on."""
    rows: list[dict] = []
    csv_path = Path(spec.out) / "sweep.csv"
    jobs = plan_jobs(spec, resume)
    for i, job in enumerate(jobs, 1):
        log.info(
            "sweep %d/%d: %s on %s, chunk policy %s",
            i,
            len(jobs),
            job.config,
            job.dataset,
            job.chunk_policy,
        )
        job.out_dir.mkdir(parents=True, exist_ok=True)
        try:
            job.config = config_with_chunk_policy(job.config, job.chunk_policy, job.out_dir)
            runner(job)
            summaries = summarize(read_results(job.out_dir / "results.jsonl"))
            rows += [csv_row(job, s, "ok") for s in summaries]
            if not summaries:
                rows.append(csv_row(job, None, "error: the run wrote no results"))
        except Exception as e:
            if fail_fast:
                write_csv(rows, csv_path)
                raise
            log.error("sweep run %s failed: %s", job.out_dir, e)
            rows.append(csv_row(job, None, f"error: {e}"))
        write_csv(rows, csv_path)
    return rows


def _fmt(v, pattern: str) -> str:
    return "-" if v is None else pattern.format(v)


def _pct(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{100 * v:.{digits}f}%"


def build_table(rows: list[dict]) -> Table:
    table = Table(
        title="sweep",
        box=box.SIMPLE_HEAD,
        caption_justify="left",
        caption=(
            "÷#R: median of per-sample E2E latency ratios to setting #R. EE: early-exit time ÷ E2E."
        ),
    )
    for name in (
        "config",
        "dataset",
        "chunk",
        "set",
        "n",
        "err",
        "acc",
        "med s",
        "÷#1",
        "÷#2",
        "EE",
        "cached",
        "status",
    ):
        table.add_column(
            name,
            no_wrap=True,
            justify="left" if name in ("config", "dataset", "chunk", "status") else "right",
        )
    for r in rows:
        table.add_row(
            r["config"],
            r["dataset"],
            r["chunk_policy"],
            _fmt(r.get("setting"), "#{}"),
            _fmt(r.get("n"), "{}"),
            _fmt(r.get("errors"), "{}"),
            _pct(r.get("accuracy")),
            _fmt(r.get("latency_median_s"), "{:.2f}"),
            _fmt(r.get("latency_vs_1_median"), "{:.2f}"),
            _fmt(r.get("latency_vs_2_median"), "{:.2f}"),
            _pct(r.get("ee_overhead_share")),
            _pct(r.get("cached_token_ratio"), 0),
            r["status"] if r["status"] == "ok" else f"[red]{r['status'][:60]}[/red]",
        )
    return table


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "spec",
        metavar="SPEC.json",
        help="configs, datasets, settings, chunk "
        "policies, num_samples, concurrency, out (see experiments/sweep_spec.py)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="skip (sample, setting) pairs already in each run's results.jsonl",
    )
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failed run")


def main(args: argparse.Namespace, runner: Runner = run_with_experiments_run) -> int:
    spec = load_spec(args.spec)
    rows = run_sweep(spec, runner, resume=args.resume, fail_fast=args.fail_fast)
    console = Console(soft_wrap=True)
    if not console.is_terminal:
        console = Console(width=150, soft_wrap=True)
    console.print(build_table(rows))
    console.print(f"wrote {Path(spec.out) / 'sweep.csv'}")
    return 1 if any(r["status"] != "ok" for r in rows) else 0
