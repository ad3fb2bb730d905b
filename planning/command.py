"""`moa-pd plan`: its flags and its two modes. Without --profile, memory placement
(planning.placement): the configs' workers packed onto the GPUs here (--gpus) or assumed
(--gpu-memory), printed. With --profile profile.json, a plan for the devices named (--gpus
N[xMEM] | --cpus N[xMEM], --nodes K): the MILP's proposal refined by a local search the simulator
scores (planning.ilp_plan), printed beside the baselines and the bounds (or as JSON, --json), and
written to plan.json (--out).

Importing this module (the CLI does, for `moa-pd --help`) stays light: the MILP, the profile and
the simulator are imported by the command that uses them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from planning.pack import PlanError
from planning.placement import PlacementOptions, add_placement_args, placement_for, print_placement
from planning.types import MODES, SEARCH_SECONDS

if TYPE_CHECKING:
    from planning.devices import Cluster
    from planning.ilp_plan import Evaluator
    from profiling.profile_file import Profile

# A CPU worker's memory beyond weights and pool: the Python process and torch's runtime.
CPU_HEADROOM_MIB = 1024


def add_plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--profile", help="profile.json (moa-pd profile): solve placement and replication as a MILP"
    )
    p.add_argument(
        "--mode",
        choices=MODES,
        default="replicate",
        help="with --profile: replicate (replica counts free) or fixed (one replica per role)",
    )
    p.add_argument("--nodes", type=int, default=1, help="with --profile: nodes of --gpus each")
    p.add_argument(
        "--cpus",
        metavar="N[xMEM]",
        help="with --profile: plan for N cores sharing the node's RAM (default: this machine's)",
    )
    p.add_argument("--hosts", help="with --profile: the nodes' addresses, comma-separated")
    p.add_argument("--out", help="with --profile: write the plan here (plan.json)")
    p.add_argument(
        "--search-seconds",
        type=float,
        default=SEARCH_SECONDS,
        help="with --profile: the local search's budget after the MILP (default %(default)s; 0: "
        "the best of the MILP's proposal and the baselines)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="with --profile: print the plans, the bounds and the solve time as JSON, for sweeps",
    )


def _cluster(args: argparse.Namespace, profile: Profile) -> Cluster:
    from planning.devices import cluster

    dev = profile.device
    if args.cpus:
        import psutil

        ram = psutil.virtual_memory().total >> 20
        return cluster("cpu", args.cpus, args.nodes, ram, dev.name)
    spec = args.gpus or args.gpu_memory
    if not spec:
        if dev.kind != "cuda":
            raise PlanError(
                f"the profile is of a CPU ({dev.name}): give --cpus N, or --gpus N[xMEM] to plan "
                "for GPUs"
            )
        spec = str(dev.count)
    if "," in spec:
        raise PlanError(
            f"--gpus {spec!r}: with --profile, --gpus is a count of GPUs per node, e.g. 8 or "
            "8x141GiB"
        )
    default = dev.memory_mib if dev.kind == "cuda" else None
    return cluster("gpu", spec, args.nodes, default, dev.name)


def run_plan(args: argparse.Namespace, evaluate: Evaluator) -> int:
    """`moa-pd plan --profile`: the plan and what it is judged against, printed (and written)."""
    import json

    from planning.ilp_plan import PlanRequest, plan_with_ilp
    from planning.tables import comparison_table, worker_table
    from profiling.machine import warn_if_elsewhere
    from profiling.profile_file import Profile
    from router.config_loader import load_config

    err = Console(stderr=True, soft_wrap=True)
    try:
        profile = Profile.load(args.profile)
    except (OSError, ValueError) as e:
        err.print(f"[red]error:[/red] --profile {escape(args.profile)}: {escape(str(e))}")
        return 2
    warn_if_elsewhere(profile, args.profile)
    if args.search_seconds < 0:
        err.print(f"[red]error:[/red] --search-seconds must be >= 0, got {args.search_seconds}")
        return 2
    configs = [load_config(c) for c in args.config]
    try:
        clus = _cluster(args, profile)
        req = PlanRequest(
            configs,
            list(args.config),
            profile,
            args.profile,
            clus,
            args.concurrency,
            args.mode,
            args.question_tokens,
            CPU_HEADROOM_MIB if clus.kind == "cpu" else args.gpu_headroom_mib,
            tuple(h.strip() for h in args.hosts.split(",")) if args.hosts else (),
            args.search_seconds,
        )
        report = plan_with_ilp(req, evaluate)
    except PlanError as e:  # escaped: messages hold "N[xMEM]", which rich reads as markup
        err.print(f"[red]error:[/red] {escape(str(e))}")
        return 2
    if args.out:
        report.plan.dump(args.out)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return 0
    console = Console(width=max(Console().width, 132), soft_wrap=True)
    console.print(worker_table(report.plan))
    console.print(comparison_table(report))
    if args.out:
        console.print(f"plan written to {Path(args.out)}")
    return 0


def main(args: argparse.Namespace) -> int:
    from router.config_loader import load_config

    if args.profile:
        from simulation.predict import predict_plan

        return run_plan(args, predict_plan)

    configs = [load_config(c) for c in args.config]
    try:
        plan = placement_for(configs, PlacementOptions.from_args(args))
    except PlanError as e:
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {e}")
        return 2
    print_placement(plan)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", action="append", required=True, help="config (path or name)")
    add_placement_args(p)
    add_plan_args(p)
