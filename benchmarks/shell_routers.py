"""Several shell routers over one worker deployment, each with its own cluster-file overrides,
so that benchmarks compare router behaviours on the same workers (and caches) in one run; and a
copy of a topology config whose torch workers schedule by SGLang priority."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from launch.ports import free_port
from launch.procs import Proc, ProcSpec, start, wait_healthy
from router.config_loader import config_from_dict, resolve_config_path


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
