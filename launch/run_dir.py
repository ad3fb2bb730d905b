"""Who owns a run folder: the deployment recorded in its processes.json, alive or not (a pid with
its start time names a process for good), a lock held while one `moa-pd up` starts there, and the
record a stopped deployment leaves (processes.stopped.json), so a second `moa-pd down` can tell
"already stopped" from "never started here". Used by launch/stack.py."""

from __future__ import annotations

import fcntl
import json
import logging
from pathlib import Path
from typing import IO

from launch.procs import LaunchError, stop_groups
from router.api_key import KEY_FILE
from router.cluster import create_time

log = logging.getLogger(__name__)
PIDFILE = "processes.json"
STOPPED = "processes.stopped.json"
LOCK = ".up.lock"


def recorded(run_dir: Path) -> list[dict]:
    """The processes RUN_DIR/processes.json records (none when it has none). LaunchError for
    rows without a create_time (an older moa-pd recorded `start_ticks`): whether those pids are
    still its processes cannot be told, so nothing is stopped or taken over, and the file stays."""
    path = Path(run_dir) / PIDFILE
    rows = json.loads(path.read_text()) if path.exists() else []
    # A null create_time is ours too: the process had exited when the file was written.
    old = [r for r in rows if "create_time" not in r]
    if old:
        pids = " ".join(str(r["pid"]) for r in old)
        names = ", ".join(f"{r.get('name', '?')} (pid {r['pid']})" for r in old)
        raise LaunchError(
            f"{path} was written by an older moa-pd (no create_time for {names}), so whether "
            f"these pids are still its processes cannot be told. Check with `ps -o pid,lstart,"
            f"cmd -p {pids}`, stop those that are its with `kill {pids}`, then delete {path}"
        )
    return rows


def alive(rows: list[dict]) -> list[dict]:
    """The rows whose process still runs: same pid, same start time (a reused pid is not ours)."""
    return [r for r in rows if create_time(r["pid"]) == r.get("create_time")]


def _refusal(run_dir: Path, live: list[dict]) -> LaunchError:
    names = ", ".join(f"{r['name']} (pid {r['pid']})" for r in live) or "a deployment starting"
    return LaunchError(
        f"{run_dir} holds a running deployment: {names}; stop it with `moa-pd down --run-dir "
        f"{run_dir}`, or start this one in another folder (--run-dir)"
    )


def claim(run_dir: Path) -> IO:
    """Take `run_dir` for a new deployment, or LaunchError naming what runs there and the two
    ways out. A folder whose recorded processes are all gone is taken over. The returned lock
    (a flock) keeps a second `moa-pd up` out while this one starts; closing it releases it."""
    run_dir = Path(run_dir)
    lock = open(run_dir / LOCK, "w")  # noqa: SIM115 - held past this function, closed by release()
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise _refusal(run_dir, alive(recorded(run_dir))) from None
    try:
        live = alive(recorded(run_dir))
    except LaunchError:
        lock.close()
        raise
    if live:
        lock.close()
        raise _refusal(run_dir, live)
    if (run_dir / PIDFILE).exists():
        log.info("%s: every recorded process is gone; taking the folder over", run_dir)
        mark_stopped(run_dir)
    return lock


def mark_stopped(run_dir: Path) -> None:
    """Record that the folder's deployment is stopped: processes.json becomes
    processes.stopped.json (kept for post-mortems), and the API key file goes."""
    run_dir = Path(run_dir)
    pidfile = run_dir / PIDFILE
    if pidfile.exists():
        pidfile.replace(run_dir / STOPPED)
    elif not (run_dir / STOPPED).exists():
        (run_dir / STOPPED).write_text("[]")
    (run_dir / KEY_FILE).unlink(missing_ok=True)


def processes_to_stop(run_dir: Path) -> list[dict]:
    """For `moa-pd down`: the recorded processes still running (none when the deployment was
    stopped already); LaunchError for a folder no deployment ever ran in."""
    run_dir = Path(run_dir)
    if not (run_dir / PIDFILE).exists():
        if (run_dir / STOPPED).exists():
            return []
        raise LaunchError(
            f"{run_dir / PIDFILE} not found: nothing was started with --run-dir {run_dir}"
        )
    return alive(recorded(run_dir))


def down_run_dir(run_dir: Path) -> list[str]:
    """Stop the processes a detached `moa-pd up` recorded in run_dir that still run (a reused
    pid is left alone); returns their names, none when the deployment was stopped already.
    LaunchError for a folder no deployment ran in."""
    rows = processes_to_stop(Path(run_dir))
    stop_groups([row["pid"] for row in reversed(rows)])
    mark_stopped(Path(run_dir))
    return [r["name"] for r in rows]
