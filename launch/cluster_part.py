"""One node's part of a multi-node deployment: RUN_DIR/cluster.NODE.json, written by `moa-pd up
--plan P --node NODE` once its workers are healthy (every URL on that node's host), and read by
`moa-pd up --plan P --join DIR ...`, which merges the parts and starts the routers over them."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from launch.procs import LaunchError
from planning.plan_file import DeploymentPlan


class _Part(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class ModelPart(_Part):
    """One model's workers on one node, each list in replica order."""

    prefill_replicas: list[int] = []
    prefill_urls: list[str] = []
    bootstrap_ports: list[int | None] = []
    decode_replicas: list[int] = []
    decode_urls: list[str] = []
    prefill_devices: list[str] = []
    decode_devices: list[str] = []
    processes: dict[str, dict] = {}
    model_path: str
    tokenizer_path: str
    priority_scheduling: bool = False


class NodePart(_Part):
    node: str
    host: str
    backend: str
    models: dict[str, ModelPart] = Field(min_length=1)
    devices: dict[str, int] = {}


def part_path(run_dir: Path, node: str) -> Path:
    return Path(run_dir) / f"cluster.{node}.json"


def find_part(run_dir: Path) -> Path:
    """The one cluster.NODE.json in run_dir, or LaunchError saying what is there instead."""
    found = sorted(Path(run_dir).glob("cluster.*.json"))
    if len(found) != 1:
        what = ", ".join(p.name for p in found) or "none"
        raise LaunchError(
            f"{run_dir}: expected one cluster.NODE.json (written by `moa-pd up --plan P --node "
            f"NODE --run-dir {run_dir}` once its workers are healthy), found {what}"
        )
    return found[0]


def load_part(path: Path) -> NodePart:
    try:
        return NodePart.model_validate_json(Path(path).read_text())
    except (OSError, ValidationError) as e:
        raise LaunchError(f"node part {path} cannot be used: {e}") from None


def merge_parts(plan: DeploymentPlan, plan_path: str, parts: dict[Path, NodePart]) -> dict:
    """{model: merged entry} over every node's part: URLs, bootstrap ports and devices in replica
    order, each (model, role, replica) of the plan exactly once. The processes keep their name
    and log but not their pid: a pid names a process on its own node only, so the shell router
    watches remote workers by their /health alone."""
    nodes = {n.name: n for n in plan.nodes}
    seen: dict[str, Path] = {}
    rows: dict[str, dict[str, list[tuple]]] = {}
    merged: dict[str, dict] = {}
    for path, part in parts.items():
        if part.node not in nodes:
            raise LaunchError(f"{path}: node '{part.node}' is not in plan {plan_path}")
        if part.node in seen:
            raise LaunchError(f"{path} and {seen[part.node]} are both node '{part.node}'")
        seen[part.node] = path
        for name, m in part.models.items():
            entry = merged.setdefault(
                name,
                {
                    "model_path": m.model_path,
                    "tokenizer_path": m.tokenizer_path,
                    "priority_scheduling": m.priority_scheduling,
                    "processes": {},
                },
            )
            entry["processes"].update(
                {
                    url: {k: v for k, v in p.items() if k in ("name", "log")}
                    for url, p in m.processes.items()
                }
            )
            by_role = rows.setdefault(name, {"prefill": [], "decode": []})
            boot = m.bootstrap_ports or [None] * len(m.prefill_urls)
            pdev = m.prefill_devices or [""] * len(m.prefill_urls)
            ddev = m.decode_devices or [""] * len(m.decode_urls)
            by_role["prefill"] += zip(m.prefill_replicas, m.prefill_urls, boot, pdev, strict=True)
            by_role["decode"] += zip(m.decode_replicas, m.decode_urls, ddev, strict=True)
    if missing := sorted(set(nodes) - set(seen)):
        raise LaunchError(
            f"no part for node(s) {', '.join(missing)} of plan {plan_path}; start each with "
            f"`moa-pd up --plan {plan_path} --node NAME --run-dir DIR` and --join its DIR"
        )
    for w in plan.workers:
        got = [r for r in rows.get(w.model, {}).get(w.role, []) if r[0] == w.replica]
        if len(got) != 1:
            raise LaunchError(
                f"{w.name} (node {w.node} of plan {plan_path}) is in {len(got)} node parts, not "
                "1: were the parts started from this plan?"
            )
    for name, by_role in rows.items():
        pre, dec = sorted(by_role["prefill"]), sorted(by_role["decode"])
        entry = merged[name]
        entry["prefill_urls"] = [r[1] for r in pre]
        entry["bootstrap_ports"] = [r[2] for r in pre]
        entry["decode_urls"] = [r[1] for r in dec]
        if all(r[3] for r in pre) and all(r[2] for r in dec):
            entry["prefill_devices"] = [r[3] for r in pre]
            entry["decode_devices"] = [r[2] for r in dec]
    return merged


def write_json(path: Path, data: dict) -> None:
    """Atomically: a reader polling for the file never sees half of it."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)
