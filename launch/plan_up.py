"""`moa-pd up --plan plan.json [--node NAME | --join DIR ...]`: the Stack of a plan's deployment.
A one-node plan starts whole; a plan over nodes starts one node's workers per `--node` (each
writes RUN_DIR/cluster.NODE.json), then, on any node, `--join` starts the routers over them."""

from __future__ import annotations

from pathlib import Path

from launch.cluster_part import find_part, load_part, merge_parts
from launch.plan_deploy import PlanSlice, check_plan, load_plan, node_names_error
from launch.procs import LaunchError
from launch.stack import Stack
from planning.models import merge_models
from planning.pack import PlanError
from router.config_loader import ConfigError, load_config, load_configs_by_name
from router.config_loader import resolve_config_path as _resolve


def plan_config_paths(plan_configs: list[str], plan_path: str) -> list[str]:
    """The plan's configs as given (a path or a cfgs/ name), else relative to the plan's folder."""
    out = []
    for c in plan_configs:
        beside = Path(plan_path).parent / c
        try:
            out.append(str(_resolve(c)))
        except ConfigError:
            if not beside.is_file():
                raise LaunchError(
                    f"plan {plan_path}: configs: '{c}' is neither a config file, a cfgs/ name "
                    "nor a file beside the plan; pass the configs with --config"
                ) from None
            out.append(str(beside))
    return out


def make_plan_stack(
    plan_path: str,
    config_names: list[str] | None,
    backend: str | None,
    run_dir: Path,
    host: str | None = None,
    node: str | None = None,
    join: list[str] | None = None,
    warmup_verb: str = "generate",
    api_key: str | None = None,
) -> Stack:
    """The Stack of the plan's part that this command starts, or LaunchError for a bad plan (the
    JSON path named), a node the plan has not, a plan over nodes started without --node/--join.
    `host` overrides the node's (a batch scheduler knows the addresses only once it allocates)."""
    plan = load_plan(plan_path)
    if backend and backend != plan.backend:
        raise LaunchError(
            f"plan {plan_path} is for --backend {plan.backend}, not {backend}; leave --backend "
            "out or plan again"
        )
    if node and join:
        raise LaunchError("--node starts one node's workers, --join the routers: give one")
    paths = (
        [str(_resolve(c)) for c in config_names]
        if config_names
        else plan_config_paths(plan.configs, plan_path)
    )
    configs = [load_config(p) for p in paths]
    load_configs_by_name(paths)
    try:
        models = merge_models(configs)
    except PlanError as e:
        raise LaunchError(str(e)) from None
    check_plan(plan, plan_path, models)
    if node is not None and node not in {n.name for n in plan.nodes}:
        names = ", ".join(n.name for n in plan.nodes)
        raise LaunchError(f"plan {plan_path}: --node {node}: no such node; it has {names}")
    if node is None and not join and len(plan.nodes) > 1:
        raise LaunchError(node_names_error(plan, plan_path))
    part = PlanSlice(plan, node)
    joined, devices = None, {}
    if join:
        parts = {p: load_part(p) for p in (find_part(Path(d)) for d in join)}
        for p, nodepart in parts.items():
            if nodepart.backend != plan.backend:
                raise LaunchError(
                    f"{p} runs --backend {nodepart.backend}, the plan says {plan.backend}"
                )
            devices.update(nodepart.devices)
        joined = merge_parts(plan, plan_path, parts)
    return Stack(
        configs,
        paths,
        plan.backend,
        run_dir,
        host=host or part.host,
        # Joining, the workers run elsewhere: nothing here to place.
        placement=None if join else part.placement(),
        sglang_cpu=plan.backend == "sglang" and not part.on_gpus(),
        warmup_verb=warmup_verb,
        # Decode running requests as the planner simulated them (pools come with the plan).
        concurrency=plan.predicted.concurrency,
        api_key=api_key,
        plan=part,
        joined=joined,
        joined_devices=devices,
    )
