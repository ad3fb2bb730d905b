"""Run a PD pair's processes: each in its own process group, logs to files, health-gated.

Called by `python -m sglang_ext.sglang_backend` (and so by launch/gpu_validate.sh).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Proc:
    """One started process: its name, handle and log file."""

    name: str
    popen: subprocess.Popen
    log_path: Path

    def log_tail(self, n_bytes: int = 4000) -> str:
        data = self.log_path.read_bytes() if self.log_path.exists() else b""
        return data[-n_bytes:].decode(errors="replace")


def start(name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None) -> Proc:
    """Start `argv` in a new session (so stop() can end its whole tree) with output to a log."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True, env=env)
    logger.info("started %s (pid %d), log %s", name, popen.pid, log_path)
    return Proc(name, popen, log_path)


def wait_healthy(proc: Proc, url: str, timeout_s: float, path: str = "/health") -> None:
    """Poll GET url+path until 200; raise with the log tail if the process dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode} before it was "
                               f"healthy; log {proc.log_path}:\n{proc.log_tail()}")
        try:
            with urllib.request.urlopen(url + path, timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass  # not listening yet
        time.sleep(1.0)
    raise TimeoutError(f"{proc.name} not healthy at {url}{path} after {timeout_s:.0f}s; "
                       f"log {proc.log_path}:\n{proc.log_tail()}")


def stop(procs: list[Proc], grace_s: float = 30.0) -> None:
    """SIGTERM each process group we started (last first), then SIGKILL what is left."""
    for proc in reversed(procs):
        if proc.popen.poll() is None:
            try:
                os.killpg(proc.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    for proc in reversed(procs):
        try:
            proc.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            logger.warning("%s did not stop in %.0fs; killing its group", proc.name, grace_s)
        # The group may outlive its leader (SGLang's schedulers): always sweep it.
        try:
            os.killpg(proc.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.popen.wait()
