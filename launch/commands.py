"""`moa-pd up`: bring a deployment up from configs or a plan (`moa-pd down` stops it)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console

from launch.cluster_part import part_path
from launch.procs import LaunchError
from launch.stack import Stack
from planning.pack import PlanError
from planning.placement import PlacementOptions, add_placement_args, placement_for, print_placement
from planning.pool_need import pool_needs
from router.api_key import ENV_VAR, KEY_FILE, key_from_env
from router.config_loader import load_config, load_configs_by_name, resolve_config_path

console = Console(stderr=True, soft_wrap=True)


def default_run_dir() -> Path:
    return Path("runs") / time.strftime("%Y%m%d-%H%M%S")


def make_stack(
    config_names: list[str],
    backend: str,
    run_dir: Path,
    host: str,
    pin_cpus: bool = False,
    warmup_verb: str = "generate",
    placement: PlacementOptions | None = None,
    api_key: str | None = None,
) -> Stack:
    """A Stack for the configs; for SGLang on GPUs, with its placement (planning/), which
    refuses a deployment that does not fit before anything starts."""
    paths = [str(resolve_config_path(c)) for c in config_names]
    configs = [load_config(p) for p in paths]
    load_configs_by_name(paths)  # two different configs under one name: stop before starting
    opts = placement or PlacementOptions()
    plan, sglang_cpu = None, False
    if backend == "sglang":
        from planning.gpus import has_nvidia_gpus

        if has_nvidia_gpus() or opts.gpu_memory:
            try:
                plan = placement_for(configs, opts)
            except PlanError as e:
                raise LaunchError(str(e)) from None
        else:
            # No GPU: real SGLang on its own CPU path (sglang_ext/sglang_backend/cpu.py).
            sglang_cpu = True
            console.print(
                "no NVIDIA GPU here: real SGLang runs on its CPU path "
                "(≈3.7 GB and ≈20-30 s to start per worker)"
            )
    return Stack(
        configs,
        paths,
        backend,
        run_dir,
        host=host,
        placement=plan,
        pin_cpus=pin_cpus,
        sglang_cpu=sglang_cpu,
        warmup_verb=warmup_verb,
        pool_needs=pool_needs(configs, opts.concurrency, opts.question_tokens),
        concurrency=opts.concurrency,
        api_key=api_key,
    )


def bring_up(stack: Stack) -> dict:
    """Start the stack with a live status line per ready process."""
    with console.status("starting workers...") as status:

        def ready(proc) -> None:
            console.print(f"  [green]ready[/green] {proc.spec.name} ({proc.spec.health_url})")
            status.update(f"waiting for the rest (started {len(stack.procs)})...")

        cluster = stack.up(on_ready=ready)
    written = part_path(stack.run_dir, stack.node) if stack.node else stack.cluster_path
    console.print(f"cluster up: {written}; logs in {stack.run_dir / 'logs'}")
    return cluster


def main(args: argparse.Namespace) -> int:
    """`moa-pd up`."""
    if args.gpu_memory and not args.dry_run:
        console.print(
            "[red]error:[/red] --gpu-memory plans for GPUs that are not here: add --dry-run"
        )
        return 2
    if args.api_key is not None and not args.api_key.strip():
        console.print("[red]error:[/red] --api-key is empty; give a key or leave the flag out")
        return 2
    if not args.plan and (args.node or args.join):
        console.print("[red]error:[/red] --node and --join start parts of a plan: add --plan")
        return 2
    if args.plan and args.pin_cpus:
        console.print(
            "[red]error:[/red] a plan pins its workers itself (workers[].cpus): drop --pin-cpus"
        )
        return 2
    if not args.plan and not args.config:
        console.print("[red]error:[/red] give --config (repeatable) or --plan plan.json")
        return 2
    run_dir = Path(args.run_dir or default_run_dir())
    try:
        if args.plan:
            from launch.plan_up import make_plan_stack

            stack = make_plan_stack(
                args.plan,
                args.config,
                args.backend,
                run_dir,
                args.host,
                args.node,
                args.join,
                args.warmup_verb,
                args.api_key or key_from_env(),
            )
        else:
            stack = make_stack(
                args.config,
                args.backend or "torch",
                run_dir,
                args.host or "127.0.0.1",
                args.pin_cpus,
                args.warmup_verb,
                PlacementOptions.from_args(args),
                args.api_key or key_from_env(),
            )
    except LaunchError as e:
        console.print(f"[red]error:[/red] {e}")
        return 2
    if args.dry_run:
        if stack.placement is None:
            console.print("no GPU placement: only --backend sglang on GPUs is placed")
        else:
            print_placement(stack.placement)
        return 0
    stack.die_with_parent = not args.detach
    try:
        cluster = bring_up(stack)
    except LaunchError as e:
        console.print(f"[red]error:[/red] {e}")
        return 1
    if stack.node is not None:
        console.print(
            f"node {stack.node}: workers up on {stack.host}; start the routers with "
            f"`moa-pd up --plan {args.plan} --join {stack.run_dir} ...`"
        )
    else:
        console.print(f"shell router: {cluster['shell_router_url']}")
    if args.detach:
        stack.procs.clear()  # leave them running; `moa-pd down --run-dir` stops them
        console.print(f"detached; stop with: moa-pd down --run-dir {stack.run_dir}")
        return 0
    console.print("serving; Ctrl-C stops every process started here")
    try:
        while all(p.popen.poll() is None for p in stack.procs):
            time.sleep(1.0)
        dead = next(p for p in stack.procs if p.popen.poll() is not None)
        console.print(
            f"[red]{dead.spec.name} exited[/red]; last lines of its log:\n{dead.log_tail()}"
        )
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        console.print("stopping...")
        stack.down()


def add_pin_cpus(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--pin-cpus",
        action="store_true",
        help="pin each worker to its own CPU cores (prefill from the first core, "
        "decode from the last), as separate GPUs would keep them apart",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        action="append",
        help="topology config (path or name); repeat for several (with --plan: default the plan's)",
    )
    p.add_argument("--backend", choices=["torch", "sglang"], help="default torch, or the plan's")
    p.add_argument("--run-dir", help="where cluster.json and logs go (default runs/<time>)")
    p.add_argument(
        "--host", help="address to bind and advertise (default 127.0.0.1, or the plan node's)"
    )
    p.add_argument(
        "--plan",
        help="start this plan.json's workers (replicas, devices, pools, request split) instead "
        "of one prefill and decode worker per model",
    )
    p.add_argument(
        "--node",
        help="with --plan: start only this node's workers and write RUN_DIR/cluster.NODE.json",
    )
    p.add_argument(
        "--join",
        action="append",
        metavar="RUN_DIR",
        help="with --plan: start the routers over the node parts in these run dirs (one per "
        "node; repeatable)",
    )
    p.add_argument(
        "--api-key",
        help="require this key as `Authorization: Bearer KEY` on every shell-router route but "
        f"/health; kept in RUN_DIR/{KEY_FILE} (mode 0600). Prefer {ENV_VAR}: a command line is "
        "visible in ps",
    )
    p.add_argument(
        "--warmup-verb",
        choices=["generate", "prefill_only"],
        default="generate",
        help="how the shell router sends warm-ups: SGLang's /generate with the fake "
        "bootstrap host (default), or the /prefill_only route both backends serve",
    )
    p.add_argument(
        "--detach", action="store_true", help="return once healthy, leave the processes running"
    )
    p.add_argument("--dry-run", action="store_true", help="print the GPU placement; start nothing")
    add_placement_args(p)
    add_pin_cpus(p)
