"""`moa-pd plan` and the placement flags of `moa-pd up/run`: build a deployment's placement
from its configs and the GPUs here (or assumed ones), and print it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from rich.console import Console

from planning.deployment import ModelToPlace, plan_deployment
from planning.model_memory import ModelConfigError
from planning.pack import HEADROOM_MIB, MIN_HEADROOM_MIB, PlanError
from planning.pool_need import DEFAULT_QUESTION_TOKENS
from planning.table import placement_tables
from planning.types import POLICIES, Placement, Policy
from router.config import TopologyConfig

PLACEMENT_WIDTH = 132


@dataclass(frozen=True, slots=True)
class PlacementOptions:
    gpus: str | None = None  # "0,2": only these GPUs (nvidia-smi indices)
    policy: Policy = "pack"
    concurrency: int = 1
    question_tokens: int = DEFAULT_QUESTION_TOKENS
    gpu_memory: str | None = None  # "2x80GiB": plan for assumed GPUs instead of nvidia-smi's
    headroom_mib: int = HEADROOM_MIB  # per worker and GPU, beyond weights and pool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PlacementOptions:
        return cls(
            args.gpus,
            args.gpu_policy,
            args.concurrency,
            args.question_tokens,
            getattr(args, "gpu_memory", None),
            args.gpu_headroom_mib,
        )


def add_placement_args(
    p: argparse.ArgumentParser, concurrency: bool = True, assumed: bool = True
) -> None:
    """--gpus, --gpu-policy, --question-tokens; --concurrency (unless the command has its own)
    and --gpu-memory (assumed GPUs, only where nothing is started: plan, up --dry-run)."""
    p.add_argument(
        "--gpus",
        help="use only these GPUs (nvidia-smi indices), e.g. 0,1; with plan --profile: GPUs per "
        "node, N[xMEM], e.g. 8x141GiB",
    )
    p.add_argument(
        "--gpu-policy",
        choices=POLICIES,
        default="pack",
        help="pack: workers share GPUs where they fit (default); one-per-worker: a GPU each",
    )
    if concurrency:  # `moa-pd run` has its own --concurrency, which sizes the pools too
        p.add_argument(
            "--concurrency", type=int, default=1, help="questions in flight; sizes the KV pools"
        )
    p.add_argument(
        "--question-tokens",
        type=int,
        default=DEFAULT_QUESTION_TOKENS,
        help=f"tokens allowed for a question in a prompt (default {DEFAULT_QUESTION_TOKENS})",
    )
    p.add_argument(
        "--gpu-headroom-mib",
        type=int,
        default=HEADROOM_MIB,
        help="memory per worker and GPU beyond weights and KV pool: CUDA context and graphs, "
        f"activations (default {HEADROOM_MIB}, at least {MIN_HEADROOM_MIB})",
    )
    if not assumed:
        return
    p.add_argument(
        "--gpu-memory",
        metavar="NxMEM",
        help="plan for N identical empty GPUs (e.g. 2x80GiB) instead of nvidia-smi's table",
    )


def placement_for(configs: list[TopologyConfig], opts: PlacementOptions) -> Placement:
    """The placement of the configs' workers on the GPUs here (or assumed); PlanError if it
    does not fit, naming the model, the GPU, the need and what is free."""
    from planning.gpus import assumed_gpus, query_gpus, select_gpus
    from planning.models import merge_models, resolve_model

    gpus = assumed_gpus(opts.gpu_memory) if opts.gpu_memory else query_gpus()
    gpus = select_gpus(gpus, opts.gpus)
    models = [
        ModelToPlace(name, spec, resolve_model(spec, "sglang")[0])
        for name, spec in merge_models(configs).items()
    ]
    try:
        return plan_deployment(
            models,
            configs,
            gpus,
            opts.policy,
            opts.concurrency,
            opts.question_tokens,
            opts.headroom_mib,
        )
    except ModelConfigError as e:
        raise PlanError(str(e)) from None


def print_placement(plan: Placement, console: Console | None = None) -> None:
    # At least as wide as the tables (~130 columns): a pipe or a narrow terminal would otherwise
    # cut worker names and numbers (a terminal wraps the long lines instead).
    console = console or Console(width=max(Console().width, PLACEMENT_WIDTH))
    for table in placement_tables(plan):
        console.print(table)


def _cmd_plan(args: argparse.Namespace) -> int:
    from router.config_loader import load_config

    if args.profile:
        from planning.plan_command import run_plan
        from simulation.predict import predict_plan

        return run_plan(args, predict_plan)

    configs = [load_config(c) for c in args.config]
    try:
        plan = placement_for(configs, PlacementOptions.from_args(args))
    except PlanError as e:
        Console(stderr=True).print(f"[red]error:[/red] {e}")
        return 2
    print_placement(plan)
    return 0


def register(sub) -> None:
    from planning.plan_command import add_plan_args

    p = sub.add_parser(
        "plan",
        help="place a deployment's SGLang workers on GPUs by memory and print it; with "
        "--profile, solve placement and replication as a MILP over profiled costs",
    )
    p.add_argument("--config", action="append", required=True, help="config (path or name)")
    add_placement_args(p)
    add_plan_args(p)
    p.set_defaults(func=_cmd_plan)
