"""What a deployment left behind, read with psutil: the tests that stop `moa-pd` with a signal
check that no process it started (each leads its own process group, see launch/procs.py) and
no port of its cluster.json outlives it. Also the tiny topology config those tests run."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from launch.ports import port_in_use
from launch.procs import live_group_members
from launch.run_dir import recorded  # noqa: F401 - the tests' view of processes.json
from router.cluster import create_time

ROOT = Path(__file__).resolve().parent.parent


def tiny_config(folder: Path, name: str = "tree_3_1_tiny", model_path: str | None = None) -> str:
    """tree_3_1_cpu with 6-token agents and no embedding model, written to folder as a user's
    own config file.
    model_path: another model for its workers (e.g. tests/tiny_models.py's)."""
    raw = json.loads((ROOT / "cfgs" / "tree_3_1_cpu.json").read_text())
    raw["name"] = name
    if model_path:
        raw["models"]["smollm2"]["model_path"] = model_path
    raw["sampling"]["max_new_tokens"] = 6
    # Early exit stays off, and votes on answers where a request turns it on: a config whose
    # method is "q" makes every shell router load and run MiniLM at start (~4 s of CPU here, a
    # third of its start), which none of the tests on this config uses.
    raw["early_exit"]["method"] = "dmv"
    for agent in raw["agents"]:
        agent.pop("sampling", None)
    path = folder / "my_tiny_tree.json"
    path.write_text(json.dumps(raw))
    return str(path)


def run_argv(config: str, out: Path, *extra: str) -> list[str]:
    """`moa-pd run` of the tiny config: 2 GSM8K questions, settings #2 and #3 (4 rows)."""
    return ["run", "--config", config, "--dataset", "gsm8k", "--num-samples", "2",
            "--settings", "2,3", "--out", str(out), *extra]  # fmt: skip


def assert_ran_once_each(out: Path) -> None:
    """The run in `out` is complete: every (sample, setting) once, none failed, and the
    summary counts each once."""
    from experiments.results import read_results

    rows = read_results(out / "results.jsonl")
    assert sorted(r.key for r in rows) == sorted({r.key for r in rows}) and len(rows) == 4
    assert all(r.ok for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    settings = [(s["setting"], s["n"], s["errors"]) for s in summary["settings"]]
    assert settings == [(2, 2, 0), (3, 2, 0)]


def descendants(pid: int) -> list[tuple[int, float | None]]:
    """(pid, create_time) of every live descendant of pid."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [(c.pid, create_time(c.pid)) for c in children]


def cluster_ports(cluster: dict) -> list[int]:
    """Every port a cluster.json names: routers, workers, bootstrap servers, shell router."""
    urls = [cluster["shell_router_url"]]
    ports = []
    for m in cluster["models"].values():
        urls += [m["router_url"], *m["prefill_urls"], *m["decode_urls"]]
        ports += m.get("bootstrap_ports", [])
    return ports + [urlsplit(u).port for u in urls]


PORT_FLAGS = ("--port", "--disaggregation-bootstrap-port", "--prometheus-port")


def recorded_ports(procs: list[dict]) -> list[int]:
    """The ports on the command lines of recorded processes (also before cluster.json exists)."""
    return [
        int(row["argv"][i + 1])
        for row in procs
        for i, a in enumerate(row["argv"][:-1])
        if a in PORT_FLAGS
    ]


def leftovers(
    procs: list[dict], children: list[tuple[int, float | None]], ports: list[int]
) -> list[str]:
    """What is still there of a deployment: recorded processes (the same pid and start time),
    members of their process groups, other descendants of the command, ports still bound."""
    left = []
    for row in procs:
        if create_time(row["pid"]) == row["create_time"]:
            left.append(f"{row['name']} (pid {row['pid']})")
        left += [
            f"pid {p} in the group of {row['name']}"
            for p in live_group_members(row["pid"])
            if p != row["pid"]
        ]
    left += [
        f"child pid {p}"
        for p, started in children
        if started is not None and create_time(p) == started
    ]
    left += [f"port {p}" for p in ports if port_in_use(p)]
    return left


def kill_leftovers(procs: list[dict], children: list[tuple[int, float | None]]) -> None:
    """After a failed check: SIGKILL what is left, so one failure does not leak processes."""
    for row in procs:
        if create_time(row["pid"]) == row["create_time"]:
            try:
                os.killpg(row["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p, started in children:
        if started is not None and create_time(p) == started:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
