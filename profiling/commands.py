"""`moa-pd profile`: measure each model of a config on this machine and write profile.json
(with `--co-run` on a CPU, also how busy processes slow each other: profiling/co_run.py).

It shows a progress bar while measuring and prints a summary table at the end."""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from profiling.knobs import add_knob_args, knobs_from_args
from profiling.measure import ModelProber, ProfileError
from profiling.profile_file import Profile
from profiling.run import Target, choose_models, decode_pool_tokens, pool_concurrency

console = Console(stderr=True, soft_wrap=True)


def summary_table(profile: Profile) -> Table:
    """One row per model: points, the fits at the largest measured shapes (those of the first
    model: one run measures every model at the same ones), the PD path's fixed cost, memory."""
    t = Table(title=f"profile: {profile.device.name} ({profile.backend})", min_width=100)
    first = next(iter(profile.models.values()))
    cold = max(p.new_tokens for p in first.prefill if p.cached_tokens == 0)
    cached = max(
        ((p.new_tokens, p.cached_tokens) for p in first.prefill if p.cached_tokens),
        key=lambda nc: nc[1],
        default=None,
    )
    ctx = max(d.context for d in first.decode)
    batches = sorted({min(d.batch for d in first.decode), max(d.batch for d in first.decode)})
    t.add_column("model")
    t.add_column("points P/D", justify="right")
    t.add_column(f"prefill {cold}", justify="right")
    if cached:
        t.add_column(f"prefill {cached[0]} after {cached[1]}", justify="right")
    for b in batches:
        t.add_column(f"step b{b} ctx {ctx}", justify="right")
    for col in ("pd fixed", "KV transfer", "weights", "KV/token"):
        t.add_column(col, justify="right")
    for name, m in profile.models.items():
        t.add_row(
            name,
            f"{len(m.prefill)}/{len(m.decode)}",
            f"{1e3 * m.prefill_seconds(cold):.1f} ms",
            *([f"{1e3 * m.prefill_seconds(*cached):.1f} ms"] if cached else []),
            *(f"{1e3 * m.decode_step_seconds(b, ctx):.2f} ms" for b in batches),
            f"{1e3 * m.pd_fixed_seconds:.1f} ms",
            "in pd fixed"
            if (bw := m.kv_transfer_bytes_per_second) is None
            else f"{bw / 2**20:.0f} MiB/s",
            f"{m.weights_bytes / 2**30:.2f} GiB",
            f"{m.kv_bytes_per_token / 2**10:.1f} KiB",
        )
    return t


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


def _measure(cluster_path: Path, target: Target) -> Profile:
    from profiling.run import check_served, profile_cluster
    from router.cluster import load_cluster

    cluster = load_cluster(cluster_path)
    check_served(cluster, target.models)
    total = len(target.models) * ModelProber.steps(target.knobs)
    with _progress() as bar:
        task = bar.add_task("profiling", total=total)

        def tick(model: str, what: str) -> None:
            bar.update(task, advance=1, description=f"{model}: {what}")

        return profile_cluster(cluster, target, tick)


def _profile(args: argparse.Namespace, target: Target) -> Profile:
    """On the running deployment (--cluster), or on one started here and stopped after."""
    from launch.commands import bring_up, make_stack
    from planning.placement import PlacementOptions

    if args.cluster:
        return _measure(Path(args.cluster), target)
    own_dir = args.run_dir is None
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="moa-pd-profile-"))
    # KV pools and running requests enough for the largest decode point (the launcher and the
    # GPU placement size both by concurrency: planning/pool_need.py).
    conc = pool_concurrency(
        target.config,
        target.models,
        decode_pool_tokens(target.knobs),
        streams=max(target.knobs.decode_batches),
        backend=args.backend,
    )
    stack = make_stack(
        [args.config],
        args.backend,
        run_dir,
        "127.0.0.1",
        placement=PlacementOptions(concurrency=conc),
    )
    ok = False
    try:
        bring_up(stack)
        profile = _measure(stack.cluster_path, target)
        ok = True
        return profile
    finally:
        stack.down()
        if not ok:
            console.print(f"the deployment's logs: {run_dir / 'logs'}")
        elif own_dir:
            shutil.rmtree(run_dir, ignore_errors=True)


def with_co_run(profile: Profile) -> Profile:
    """`profile` with the CPU's co-run slowdowns measured now (after the deployment is down)."""
    from profiling.co_run import ROUNDS, measure, phases

    runs = phases(profile.device.cores or 1, ROUNDS)
    with _progress() as bar:
        task = bar.add_task("co-run micro-benchmark", total=runs)
        co = measure(progress=lambda: bar.update(task, advance=1))
    console.print(
        f"co-run: each of k busy processes at {', '.join(f'{r:.2f}' for r in co.rates.values())}"
        f" of one alone's speed (k = 1..{len(co.rates)}): co_run_slowdown "
        f"{co.co_run_slowdown:.3f} (single rounds {min(co.round_slowdowns):.3f}-"
        f"{max(co.round_slowdowns):.3f}), oversubscribed_slowdown {co.oversubscribed_slowdown:.3f}"
    )
    device = profile.device.model_copy(
        update={
            "co_run_slowdown": round(co.co_run_slowdown, 4),
            "oversubscribed_slowdown": round(co.oversubscribed_slowdown, 4),
        }
    )
    return profile.model_copy(update={"device": device})


def main(args: argparse.Namespace) -> int:
    from launch.procs import LaunchError
    from planning.gpus import has_nvidia_gpus
    from planning.model_memory import ModelConfigError
    from planning.pack import PlanError
    from router.cluster import ClusterError
    from router.config_loader import load_config
    from router.sglang_client import WorkerError

    config = load_config(args.config)  # a ConfigError exits 2 with its message (launch/cli.py)
    out = Path(args.out)
    if not out.parent.is_dir():
        console.print(f"[red]error:[/red] --out {out}: folder {out.parent} does not exist")
        return 2
    try:
        models = choose_models(config, args.models)
        cuda = args.backend == "sglang" and has_nvidia_gpus()
        knobs = knobs_from_args(args, gpu=cuda)
    except (ProfileError, ValueError) as e:
        console.print(f"[red]error:[/red] {e}")
        return 2
    target = Target(config, models, args.backend, cuda, knobs, args.seed)
    try:
        profile = _profile(args, target)
    except (ClusterError, ModelConfigError) as e:
        console.print(f"[red]error:[/red] {e}")
        return 2
    # PlanError: nvidia-smi's table could not be read (profiling.machine.device_info).
    except (ProfileError, LaunchError, PlanError, WorkerError) as e:
        console.print(f"[red]error:[/red] {e}")
        return 1
    if args.co_run and not cuda:
        profile = with_co_run(profile)
    profile.dump(out)
    Console(width=max(132, Console().width), soft_wrap=True).print(summary_table(profile))
    console.print(f"wrote {out}")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="topology config (path or cfgs/ name)")
    p.add_argument("--backend", choices=["torch", "sglang"], default="torch")
    p.add_argument(
        "--cluster", help="cluster.json of a running deployment of this config (else one starts)"
    )
    p.add_argument(
        "--models",
        type=lambda t: [m.strip() for m in t.split(",") if m.strip()],
        help="profile only these of the config's models (comma-separated; default all)",
    )
    p.add_argument("--run-dir", help="where the started deployment's logs go (default a temp dir)")
    p.add_argument("--out", required=True, help="profile.json to write")
    p.add_argument("--seed", type=int, default=0, help="random prompt ids")
    p.add_argument(
        "--co-run",
        action="store_true",
        help="on a CPU, also measure how busy processes slow each other beyond sharing the "
        "cores (profiling/co_run.py, ~60 s on 2 cores), for the simulator",
    )
    add_knob_args(p)
