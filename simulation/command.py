"""`moa-pd simulate`: predicted latency (median, p90, the critical path's parts) and throughput
of the paper's settings on a deployment (a plan, or the configs' default) at given
concurrencies, from a profile; `--validate RUN_DIR...` compares with measured runs instead."""

from __future__ import annotations

import argparse
import dataclasses

from rich.console import Console
from rich.table import Table

from experiments.critical_path import PARTS
from experiments.results import ResultsError
from experiments.settings import SETTINGS, parse_settings
from planning.plan_file import DeploymentPlan
from profiling.machine import warn_if_elsewhere
from profiling.profile_file import load_profiles
from router.config_loader import ConfigError, load_config
from simulation import validate
from simulation.predict import deployment_for, simulate_setting, trace_rows

WIDTH = 132


def _ints(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by commas, got '{text}'"
        ) from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected numbers >= 1, got '{text}'")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--profile",
        nargs="+",
        required=True,
        metavar="PROFILE",
        help="profile.json from `moa-pd profile`; several of one machine (e.g. taken before and "
        "after some runs) are pooled",
    )
    p.add_argument("--config", help="the tree topology (settings 2, 3, 4, 7)")
    p.add_argument("--dense-config", help="the dense all-to-all topology (setting 1)")
    p.add_argument(
        "--plan",
        help="plan.json from `moa-pd plan` (default: the configs' own "
        "deployment: on a CPU profile all workers share the cores, on a GPU profile "
        "one GPU per worker)",
    )
    p.add_argument("--settings", default="2,3", help="which settings, e.g. 1,2,3 (default 2,3)")
    p.add_argument("--concurrency", type=_ints, default=[1], help="questions in flight, e.g. 1,4")
    p.add_argument("--rate", type=float, help="open-loop arrivals per second instead")
    p.add_argument("--questions", type=int, default=32, help="questions per setting (default 32)")
    p.add_argument(
        "--trace",
        help="a `moa-pd run` folder whose agents' output lengths to use "
        "(default: every agent writes its max_new_tokens)",
    )
    p.add_argument(
        "--exit-rate",
        type=float,
        help="early exit (#4) without a trace: the chance "
        "that a cluster exits once min_completed of its agents completed",
    )
    p.add_argument(
        "--workflow-priority",
        action="store_true",
        help="the router's workflow_priority with workers scheduling by priority: requests "
        "ranked by their question's start, the oldest first (default: FCFS, the router's)",
    )
    p.add_argument(
        "--critical-path-first",
        action="store_true",
        help="cluster.json's start_order: critical_path (agents of a question start longest "
        "remaining path first; default: the config's order, the router's)",
    )
    p.add_argument(
        "--gate-by-slots",
        action="store_true",
        help="the router's warm-up gate admits by slots alone (cluster.json "
        "warmup_weigh_slowdown: false; default: it weighs the decode slowdown it measures); "
        "with --validate: the runs were measured so (before stop 43)",
    )
    p.add_argument(
        "--validate",
        nargs="+",
        metavar="RUN_DIR",
        help="compare with these measured runs (their own traces) instead",
    )


def main(args: argparse.Namespace) -> int:
    console = Console(width=max(WIDTH, Console().width), soft_wrap=True)
    if args.validate:
        return validate.main(
            argparse.Namespace(
                profile=args.profile,
                runs=args.validate,
                concurrency=None,
                gate_by_slots=args.gate_by_slots,
            )
        )
    if not args.config:
        console.print("[red]error:[/] --config is required (or --validate RUN_DIR...)")
        return 2
    try:
        profile = load_profiles(args.profile)
        warn_if_elsewhere(profile, " + ".join(args.profile))
        configs = [load_config(args.config)]
        if args.dense_config:
            configs.append(load_config(args.dense_config))
        settings = parse_settings(args.settings)
        plan = DeploymentPlan.load(args.plan) if args.plan else None
        # One deployment for every row, started for the largest concurrency (as one `moa-pd up
        # --concurrency N` would serve them all).
        deployment = deployment_for(plan, configs, profile, max(args.concurrency))
        if args.gate_by_slots:
            deployment = dataclasses.replace(deployment, gate_weighs_slowdown=False)
        rows = trace_rows(args.trace) if args.trace else None
        order = ", workflow priority" if args.workflow_priority else ""
        order += ", critical path first" if args.critical_path_first else ""
        order += ", gate by slots" if args.gate_by_slots else ""
        table = Table(
            title=f"Simulated: {configs[0].name} on {deployment.description} "
            f"({profile.device.name}, {profile.backend}{order})",
            min_width=WIDTH,
        )
        for col in (
            "setting",
            "Q" if args.rate is None else "rate/s",
            "median s",
            "p90 s",
            "questions/s",
            *(f"{p} s" for p in PARTS),
        ):
            table.add_column(col, justify="left" if col == "setting" else "right")
        loads = [None] if args.rate is not None else args.concurrency
        for s in settings:
            for q in loads:
                out = simulate_setting(
                    deployment,
                    configs,
                    profile,
                    s.number,
                    q or 1,
                    args.questions,
                    rows,
                    rate_qps=args.rate,
                    exit_rate=args.exit_rate,
                    workflow_priority=args.workflow_priority,
                    critical_path_first=args.critical_path_first,
                )
                b = out.breakdown()
                table.add_row(
                    SETTINGS[s.number].label,
                    str(q) if q else f"{args.rate:g}",
                    f"{out.median_s:.2f}",
                    f"{out.p90_s:.2f}",
                    f"{out.throughput_qps:.3f}",
                    *(f"{b[p]:.2f}" for p in PARTS),
                )
    except (OSError, ValueError, ResultsError, ConfigError) as e:
        console.print(f"[red]error:[/] {e}")
        return 2
    console.print(table)
    return 0
