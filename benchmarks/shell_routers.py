"""Several shell routers over one worker deployment, each with its own cluster-file overrides,
so that benchmarks compare router behaviours on the same workers (and caches) in one run; and a
copy of a topology config whose torch workers schedule by SGLang priority."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from launch.commands import bring_up, make_stack
from launch.ports import free_port
from launch.procs import Proc, ProcSpec, start, stop_group, wait_healthy
from planning.placement import PlacementOptions
from router.config_loader import config_from_dict, resolve_config_path


@dataclass(frozen=True)
class Routers:
    cluster: dict  # the deployment's cluster file
    urls: dict[str, str]  # variant -> its shell router
    config_name: str  # the served topology's name


@contextlib.contextmanager
def routers_over_one_deployment(
    config: str, out: Path, variants: dict[str, dict], concurrency: int = 1
) -> Iterator[Routers]:
    """`config`'s workers (scheduling by priority) up under OUT/deploy for `concurrency`
    questions in flight (as `moa-pd up --concurrency`: the decode workers' running requests),
    one shell router per variant over them; everything stopped on exit."""
    path = priority_config(config, out)
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
        urls, procs = start_routers(stack.cluster_path, path, out, variants)
        yield Routers(cluster, urls, json.loads(path.read_text())["name"])
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


def start_routers(
    cluster_path: Path, config: Path, out: Path, variants: dict[str, dict]
) -> tuple[dict[str, str], list[Proc]]:
    """One shell router per variant, its cluster file the deployment's with the variant's
    overrides (OUT/cluster_NAME.json); returns {variant: url} and the processes."""
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
            "--config",
            str(config),
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
