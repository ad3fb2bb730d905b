"""`moa-pd run`: settings #1-#4 of the paper (and #5-#7) on one dataset; see experiments/run.py."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from rich.console import Console

from experiments.scoring.code_sandbox import SandboxUnavailable
from experiments.settings import parse_settings
from planning.placement import PlacementOptions, add_placement_args


def add_arguments(p: argparse.ArgumentParser) -> None:
    from launch.commands import add_pin_cpus

    p.add_argument("--config", required=True, help="the tree topology (settings 2-4)")
    p.add_argument("--dense-config", help="the dense all-to-all topology (setting 1 only)")
    p.add_argument(
        "--routed-config",
        help="the config with a pool and routing (setting 6 only), e.g. cfgs/routed_pool_cpu.json",
    )
    p.add_argument(
        "--dataset",
        required=True,
        help="gsm8k, math500, aime2025, mmlu_prox_lite, ifbench, bbh, hmmt_feb_2025, mmlu, "
        "humaneval, gpqa_diamond (your copy: MOA_PD_GPQA_PATH), humaneval_plus (your copy: "
        "MOA_PD_HUMANEVAL_PLUS_PATH), or a path to a JSONL of id, question[, answer], to "
        "GPQA's CSV or to a HumanEval/EvalPlus .jsonl[.gz]; several, comma-separated "
        "(gsm8k,mmlu,humaneval): a mixed-domain set, one question of each in turn (each "
        "shuffled by --shuffle-seed), each prompted and graded as its own dataset's",
    )
    p.add_argument("--num-samples", type=int, default=None, help="first N questions (default all)")
    p.add_argument(
        "--shuffle-seed",
        type=int,
        default=None,
        help="draw the questions from a shuffle with this seed, not in the file's order (MMLU "
        "is sorted by subject)",
    )
    p.add_argument(
        "--offset",
        type=int,
        default=0,
        help="skip the first N questions (of the shuffle with --shuffle-seed): with one seed, "
        "disjoint offsets give disjoint sets, e.g. a scorer's training and held-out questions",
    )
    p.add_argument(
        "--settings",
        default="1,2,3,4",
        help="which settings, e.g. 2,3 (default the paper's four; 5: single model, "
        "6: tree + routing, pipelined + EE (needs --routed-config), 7: tree blocking by layer)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="questions in flight at once (N > 1: settings interleave per block of 2N "
        "questions, the order turning per block)",
    )
    p.add_argument("--out", required=True, help="run folder: results.jsonl, summary, figures")
    p.add_argument("--cluster", help="cluster.json of a running deployment (else one is started)")
    p.add_argument("--backend", choices=["torch", "sglang"], default="torch")
    p.add_argument("--resume", action="store_true", help="skip (sample, setting) rows already done")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failed sample")
    p.add_argument(
        "--keep-going",
        action="store_true",
        help="when a worker is down, record the failed samples and go on (default: "
        "stop at the first failure whose deployment is down)",
    )
    add_placement_args(p, concurrency=False, assumed=False)
    add_pin_cpus(p)


def main(args: argparse.Namespace) -> int:
    from experiments.run import FailFast, RunSpec, run_experiment
    from launch.procs import LaunchError

    console = Console(stderr=True, soft_wrap=True)
    try:
        settings = parse_settings(args.settings)
        if args.concurrency < 1 or (args.num_samples is not None and args.num_samples < 1):
            raise ValueError("--concurrency and --num-samples must be at least 1")
        if args.offset < 0:
            raise ValueError(f"--offset must be at least 0, got {args.offset}")
        spec = RunSpec(
            args.config,
            args.dense_config,
            args.dataset,
            args.num_samples,
            settings,
            args.concurrency,
            Path(args.out),
            Path(args.cluster) if args.cluster else None,
            args.resume,
            args.fail_fast,
            args.backend,
            args.pin_cpus,
            keep_going=args.keep_going,
            gpu_placement=PlacementOptions.from_args(args),
            routed_config=args.routed_config,
            shuffle_seed=args.shuffle_seed,
            offset=args.offset,
        )
        written = run_experiment(spec)
    except ValueError as e:
        console.print(f"[red]error:[/red] {e}")
        return 2
    except (LaunchError, FailFast, SandboxUnavailable) as e:
        console.print(f"[red]error:[/red] {e}")
        _summarize_partial(console, Path(args.out))
        console.print(
            f"rows written so far are kept in {args.out}/results.jsonl; continue "
            f"with: {resume_command(args)}"
        )
        return 1
    except KeyboardInterrupt:
        console.print(
            f"interrupted; rows written so far are kept in {args.out}/results.jsonl; "
            f"continue with: {resume_command(args)}"
        )
        return 130
    for path in written:
        console.print(f"wrote {path}")
    return _report_failures(console, args)


def _summarize_partial(console: Console, out: Path) -> None:
    """summary.json (and what figures the rows allow) for a run that stopped early."""
    from experiments.plot_cmd import rebuild

    if (out / "results.jsonl").exists():
        for path in rebuild(out, print_table=False):
            console.print(f"wrote {path}")


def resume_command(args: argparse.Namespace) -> str:
    """The command line that continues this run (failed rows are retried)."""
    argv = list(getattr(args, "argv", None) or [])
    if not argv:
        argv = [
            "run",
            "--config",
            args.config,
            "--dataset",
            args.dataset,
            "--out",
            args.out,
            "--settings",
            args.settings,
        ]
        argv += ["--dense-config", args.dense_config] if args.dense_config else []
        routed = getattr(args, "routed_config", None)
        argv += ["--routed-config", routed] if routed else []
        argv += ["--cluster", args.cluster] if args.cluster else []
        for flag, value in (
            ("--num-samples", getattr(args, "num_samples", None)),
            ("--shuffle-seed", getattr(args, "shuffle_seed", None)),
            ("--offset", getattr(args, "offset", 0) or None),
        ):
            argv += [flag, str(value)] if value is not None else []
    if "--resume" not in argv:
        argv.append("--resume")
    return shlex.join(["moa-pd", *argv])


def _report_failures(console: Console, args: argparse.Namespace) -> int:
    """1 (and what failed, and how to resume) when any row of the run folder failed, else 0."""
    from experiments.results import read_results

    rows = read_results(Path(args.out) / "results.jsonl")
    failed = [r for r in rows if not r.ok]
    if not failed:
        return 0
    console.print(
        f"[red]{len(failed)} of {len(rows)} rows failed[/red]; first error "
        f"({failed[0].sample_id}, setting {failed[0].setting}): {failed[0].error}"
    )
    console.print(f"retry the failed rows with: {resume_command(args)}")
    return 1
