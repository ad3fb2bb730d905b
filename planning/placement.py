"""Memory placement, planning's first step (`moa-pd plan` without --profile; `moa-pd up` for
SGLang on GPUs): a deployment's workers, as many replicas as its configs give (`workers`), one
demand each (weights and KV from the model's config.json, pool from the agents), packed onto the
GPUs here or assumed (planning.pack); its flags (`add_placement_args`) and its tables. The MILP
(`moa-pd plan --profile`: planning.ilp, planning.ilp_plan) is the general case: it also chooses
the replica counts and each replica's share of requests, under the same memory rules
(planning.pack's headroom and tp), with this packing as its greedy baseline."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

from rich.console import Console

from planning.gpus import assumed_gpus, query_gpus, select_gpus
from planning.model_memory import ModelConfigError, model_memory
from planning.models import merge_models, resolve_model
from planning.pack import (
    HEADROOM_MIB,
    MIN_HEADROOM_MIB,
    PlanError,
    check_headroom,
    choose_tp,
    place,
)
from planning.pool_need import pool_needs, unused_models
from planning.prompt_length import DEFAULT_QUESTION_TOKENS
from planning.tables import placement_tables
from planning.types import GPU, POLICIES, Placement, Policy, WorkerDemand
from router.config import ModelSpec, TopologyConfig

PLACEMENT_WIDTH = 132  # columns: the tables' width (print_placement)


@dataclass(frozen=True, slots=True)
class ModelToPlace:
    name: str
    spec: ModelSpec
    model_path: str  # what the launcher resolved (a local dir, or an HF id SGLang loads)


def worker_demands(
    models: list[ModelToPlace],
    configs: list[TopologyConfig],
    gpus: list[GPU],
    concurrency: int = 1,
    question_tokens: int = DEFAULT_QUESTION_TOKENS,
    headroom_mib: int = HEADROOM_MIB,
) -> list[WorkerDemand]:
    """Every prefill and decode replica of every model, with its tp (the config's tp_size, else
    the smallest that fits one of `gpus`)."""
    if unused := unused_models(configs):  # its pool would be 0 (--max-total-tokens 0)
        raise PlanError(unused)
    needs = pool_needs(configs, concurrency, question_tokens)
    demands = []
    for m in models:
        args = m.spec.server_args.get("sglang", {})
        try:
            mem = model_memory(
                m.model_path,
                str(args.get("dtype", "auto")),
                str(args.get("kv_cache_dtype", "auto")),
            )
        except ModelConfigError as e:
            raise PlanError(f"models.{m.name}.model_path: {e}") from None
        for role, replicas in (
            ("prefill", m.spec.workers.prefill),
            ("decode", m.spec.workers.decode),
        ):
            # A pool the config asks for (server_args.sglang.max_total_tokens) is kept if larger.
            pool = max(needs.get((m.name, role), 0), int(args.get("max_total_tokens", 0)))
            for i in range(replicas):
                d = WorkerDemand(
                    m.name, role, i, 1, mem.weights_bytes, mem.kv_bytes_per_token, pool
                )
                tp = int(args.get("tp_size", 0)) or choose_tp(d, gpus, headroom_mib)
                demands.append(replace(d, tp=tp))
    return demands


def plan_deployment(
    models: list[ModelToPlace],
    configs: list[TopologyConfig],
    gpus: list[GPU],
    policy: Policy = "pack",
    concurrency: int = 1,
    question_tokens: int = DEFAULT_QUESTION_TOKENS,
    headroom_mib: int = HEADROOM_MIB,
) -> Placement:
    """The placement of every worker on `gpus`, or PlanError naming what does not fit."""
    if concurrency < 1:
        raise PlanError(f"--concurrency must be at least 1, got {concurrency}")
    check_headroom(headroom_mib)  # before choose_tp uses it
    demands = worker_demands(models, configs, gpus, concurrency, question_tokens, headroom_mib)
    return place(demands, gpus, policy, concurrency, headroom_mib)


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
            "--concurrency",
            type=int,
            default=1,
            help="questions in flight; sizes the KV pools and (reference engine) the decode "
            "workers' --max-running-requests",
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
    console = console or Console(width=max(Console().width, PLACEMENT_WIDTH), soft_wrap=True)
    for table in placement_tables(plan):
        console.print(table)
