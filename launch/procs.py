"""Child processes of a deployment: start each in its own process group with a log file, wait
for health, stop by process group. Only what we started is ever signalled."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from router.cluster import create_time

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class LaunchError(RuntimeError):
    """A deployment could not start; the message says which process and why."""


@dataclass(slots=True)
class ProcSpec:
    name: str  # e.g. "smollm2.prefill0"
    argv: list[str]
    health_url: str | None
    env: dict[str, str] = field(default_factory=dict)
    ports: list[int] = field(default_factory=list)
    # CPU cores the process (and every thread it starts) may run on; None: wherever the OS likes.
    cpus: list[int] | None = None


@dataclass(slots=True)
class Proc:
    spec: ProcSpec
    popen: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the process that started it dies, however it
    dies (kill -9 included), so a deployment never outlives its foreground `moa-pd` (Linux
    prctl PR_SET_PDEATHSIG; elsewhere the signal handlers and `stop_groups` do the job)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def start(spec: ProcSpec, log_dir: Path, die_with_parent: bool = True) -> Proc:
    """Start spec in its own process group, output to LOG_DIR/NAME.log. die_with_parent: the
    child gets SIGTERM when this process dies (off for `moa-pd up --detach`)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{spec.name}.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **spec.env}
    with open(log_path, "ab") as out:
        out.write(f"$ {' '.join(spec.argv)}\n".encode())
        out.flush()
        # start_new_session: its own process group, so `down` can stop it and its children
        # without touching anything else, and Ctrl-C in our terminal reaches only us.
        popen = subprocess.Popen(
            spec.argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent if die_with_parent else None,  # noqa: PLW1509 - one prctl call, no locks
        )
    if spec.cpus:
        # Popen returns once the child has exec'd: it is a single thread starting Python, and
        # every thread it starts later (torch, NIXL, HTTP) inherits this mask.
        os.sched_setaffinity(popen.pid, spec.cpus)
    log.info("started %s (pid %d), log %s", spec.name, popen.pid, log_path)
    return Proc(spec, popen, log_path)


def healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_healthy(
    procs: list[Proc], timeout_s: float, on_ready: Callable[[Proc], None] | None = None
) -> None:
    """Block until every proc answers 200 on its health URL; fail fast if one exits."""
    pending = [p for p in procs if p.spec.health_url]
    deadline = time.monotonic() + timeout_s
    while pending:
        for p in list(pending):
            if p.popen.poll() is not None:
                raise LaunchError(
                    f"{p.spec.name} exited with code {p.popen.returncode} during start-up; "
                    f"last lines of {p.log_path}:\n{p.log_tail()}"
                )
            if healthy(p.spec.health_url):
                pending.remove(p)
                if on_ready:
                    on_ready(p)
        if pending and time.monotonic() > deadline:
            names = ", ".join(p.spec.name for p in pending)
            tail = pending[0]
            raise LaunchError(
                f"not healthy after {timeout_s:.0f} s: {names}; last lines of "
                f"{tail.log_path}:\n{tail.log_tail()}"
            )
        time.sleep(0.25)


def wait_routable(url: str, timeout_s: float = 120.0, proc: Proc | None = None) -> None:
    """Block until a native sglang-router at url routes a request. It answers /health at once but
    registers its workers in the background, so send a 1-token greedy /generate until one
    returns 200. proc: the router's process, whose log tail goes into the error."""
    body = json.dumps(
        {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    ).encode()
    deadline, last = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        if proc is not None and proc.popen.poll() is not None:
            break
        req = urllib.request.Request(url + "/generate", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                if resp.status == 200:
                    return
        except urllib.error.HTTPError as e:
            last = f"{e.code} {e.read()[:200].decode(errors='replace')}"
        except (urllib.error.URLError, OSError) as e:
            last = repr(e)
        time.sleep(0.5)
    where = f"; last lines of {proc.log_path}:\n{proc.log_tail()}" if proc else ""
    raise LaunchError(
        f"router {url} routes no request after {timeout_s:.0f} s (last answer: {last}){where}"
    )


def stop_group(pid: int, grace_s: float = 10.0) -> None:
    """SIGTERM the process group led by pid, then SIGKILL what is left after grace_s."""
    stop_groups([pid], grace_s)


def stop_groups(pids: list[int], grace_s: float = 8.0) -> None:
    """SIGTERM every process group led by one of pids at once, then SIGKILL what is left after
    grace_s: a whole deployment stops within grace_s, not grace_s per process."""
    alive = []
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGTERM)
            alive.append(pid)
        except ProcessLookupError:
            _reap(pid)
    deadline = time.monotonic() + grace_s
    while alive and time.monotonic() < deadline:
        for pid in alive:
            _reap(pid)
        running = _live_groups()  # one scan of the processes a pass, not one per group
        alive = [pid for pid in alive if pid in running]
        if alive:
            time.sleep(0.1)
    for pid in alive:
        log.warning("process group %d ignored SIGTERM for %.0f s: SIGKILL", pid, grace_s)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _reap(pid)


def live_group_members(pgid: int) -> list[int]:
    """The processes of group pgid that still run. Zombies do not count: they hold no port and
    no memory, and a detached deployment's processes, reparented to PID 1, stay zombies until it
    reaps them (some container inits do every ~2 s), where killpg(pgid, 0) still succeeds."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    return _live_groups().get(pgid, [])


def _live_groups() -> dict[int, list[int]]:
    """Every process group with a process that is not a zombie: its pids."""
    groups: dict[int, list[int]] = {}
    for p in psutil.process_iter(["status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE:
                groups.setdefault(os.getpgid(p.pid), []).append(p.pid)
        except (OSError, psutil.Error):
            continue  # exited meanwhile, or not ours to ask
    return groups


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def write_pidfile(path: Path, procs: list[Proc]) -> None:
    rows = [
        {
            "name": p.spec.name,
            "pid": p.pid,
            "create_time": create_time(p.pid),
            "log": str(p.log_path),
            "argv": p.spec.argv,
        }
        for p in procs
    ]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rows, indent=2))
    tmp.replace(path)
