"""Several shell routers over one worker deployment, each with its own cluster-file overrides
(and, where a variant edits the topology config, a copy of it served by a name of its own), so
that benchmarks compare router behaviours on the same workers (and caches) in one run; and a
copy of a topology config whose torch workers schedule by SGLang priority."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from launch.commands import bring_up, make_stack
from launch.ports import free_port
from launch.procs import Proc, ProcSpec, start, stop_group, wait_healthy
from launch.signals import sigterm_as_ctrl_c
from planning.placement import PlacementOptions
from router.config_loader import config_from_dict, resolve_config_path


@dataclass(frozen=True)
class Routers:
    cluster: dict  # the deployment's cluster file
    urls: dict[str, str]  # variant -> its shell router
    config_name: str  # the served topology's name
    config_names: dict[str, str]  # variant -> the topology its questions name


@contextlib.contextmanager
def routers_over_one_deployment(
    config: str,
    out: Path,
    variants: dict[str, dict],
    concurrency: int = 1,
    priority_scheduling: bool = True,
    config_edits: dict[str, dict] | None = None,
) -> Iterator[Routers]:
    """`config`'s workers (scheduling by priority, unless not `priority_scheduling`: then as
    the config starts them) up under OUT/deploy for `concurrency` questions in flight (as
    `moa-pd up --concurrency`: the decode workers' running requests), one shell router per
    variant over them; `config_edits[variant]`: top-level keys that variant's copy of the config
    changes (a slot order, say). Everything stopped on exit. SIGTERM stops it as Ctrl-C does (and Ctrl-C
    works in a job started with `&`, which would ignore it), so a benchmark stopped midway
    leaves no workers or routers behind; what it wrote so far stays."""
    restore = sigterm_as_ctrl_c()
    try:
        yield from _routers(
            config, out, variants, concurrency, priority_scheduling, config_edits or {}
        )
    finally:
        restore()


@contextlib.contextmanager
def one_line_on_interrupt(rows_file: Path) -> Iterator[None]:
    """Around a benchmark's `routers_over_one_deployment`: Ctrl-C or SIGTERM ends it with one
    line saying what it kept and exit status 130 (as `moa-pd run`), not a KeyboardInterrupt
    traceback. Outside that `with`, so the deployment and routers are down when it prints."""
    started = time.time()
    try:
        yield
    except KeyboardInterrupt:
        # A rows file older than this run is an earlier run's: this one measured nothing yet.
        kept = rows_file.exists() and rows_file.stat().st_mtime >= started
        where = f"the rows measured so far are in {rows_file}" if kept else "nothing measured yet"
        print(f"interrupted: its workers and routers are stopped; {where}", file=sys.stderr)
        raise SystemExit(130) from None


def _routers(
    config: str,
    out: Path,
    variants: dict[str, dict],
    concurrency: int,
    priority_scheduling: bool,
    config_edits: dict[str, dict],
) -> Iterator[Routers]:
    path = priority_config(config, out) if priority_scheduling else resolve_config_path(config)
    name = json.loads(path.read_text())["name"]
    names = {variant: name for variant in variants}
    copies = []
    for variant, edits in config_edits.items():
        copies.append(edited_config(path, out, f"{name}-{variant.strip('#')}", edits))
        names[variant] = f"{name}-{variant.strip('#')}"
    stack = make_stack(
        [str(path)],
        "torch",
        out / "deploy",
        "127.0.0.1",
        placement=PlacementOptions(concurrency=concurrency),
    )
    procs: list[Proc] = []
    try:
        cluster = bring_up(stack)
        urls, procs = start_routers(stack.cluster_path, [path, *copies], out, variants)
        yield Routers(cluster, urls, name, names)
    finally:
        for p in procs:
            stop_group(p.pid)
        stack.down()


def priority_config(config: str, out: Path) -> Path:
    """A copy of `config` whose torch workers schedule by priority."""
    src = resolve_config_path(config)
    raw = json.loads(src.read_text(encoding="utf-8"))
    for model in raw["models"].values():
        args = model.setdefault("server_args", {}).setdefault("torch", {})
        args["enable_priority_scheduling"] = True
    config_from_dict(raw, f"{src} with priority scheduling")
    dest = out / "configs" / src.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
    return dest


def edited_config(src: Path, out: Path, name: str, edits: dict) -> Path:
    """A copy of the config at `src` named `name`, with `edits` (top-level keys) applied and
    validated, as OUT/configs/NAME.json."""
    raw = {**json.loads(src.read_text(encoding="utf-8")), **edits, "name": name}
    config_from_dict(raw, f"{src} with {edits}")
    dest = out / "configs" / f"{name}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
    return dest


def start_routers(
    cluster_path: Path, configs: list[Path], out: Path, variants: dict[str, dict]
) -> tuple[dict[str, str], list[Proc]]:
    """One shell router per variant, serving every config of `configs`, its cluster file the
    deployment's with the variant's overrides (OUT/cluster_NAME.json); returns {variant: url}
    and the processes."""
    base = json.loads(cluster_path.read_text())
    urls, procs = {}, []
    for name, overrides in variants.items():
        tag = name.strip("#")
        path = out / f"cluster_{tag}.json"
        path.write_text(json.dumps({**base, **overrides}, indent=1))
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "router",
            "--cluster",
            str(path),
            *(arg for c in configs for arg in ("--config", str(c))),
            "--port",
            str(port),
            "--log-level",
            "WARNING",
        ]
        procs.append(
            start(ProcSpec(f"router_{tag}", argv, f"http://127.0.0.1:{port}/health"), out / "logs")
        )
        urls[name] = f"http://127.0.0.1:{port}"
    wait_healthy(procs, 120)
    return urls, procs
