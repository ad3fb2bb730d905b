"""Start and stop real worker and router processes for integration tests.

Each process runs in its own process group with OMP_NUM_THREADS=1 and logs to a file; `stop`
ends exactly that group. Used by the fixtures in conftest.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from launch.procs import free_port, stop_group
from launch.worker_cmd import router_argv

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    url: str
    log: Path
    bootstrap_port: int | None = None

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


def _env(extra: dict | None) -> dict:
    env = dict(os.environ)
    env.update(
        {
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": str(REPO),
        }
    )
    env.update(extra or {})
    return env


def _die_with_parent() -> None:
    """In the child: new session (own process group), and SIGTERM when the test process dies, so a
    killed pytest run leaves no workers behind (Linux prctl PR_SET_PDEATHSIG)."""
    os.setsid()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except OSError:
        pass


def _spawn(name: str, cmd: list[str], url: str, log_dir: Path, env: dict | None) -> Proc:
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    with open(log, "wb") as fh:  # the child keeps its own copy of the descriptor
        popen = subprocess.Popen(
            cmd,
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=_env(env),
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only setsid + prctl, no locks
        )
    return Proc(name, popen, url, log)


def launcher(backend: str = "torch", patched: bool = True) -> list[str]:
    """The command that starts one worker: our launcher for either backend, or (patched=False,
    the negative control) SGLang's own `python -m sglang.launch_server`."""
    if backend == "sglang" and not patched:
        return [sys.executable, "-m", "sglang.launch_server"]
    return [sys.executable, "-m", "sglang_ext.launch_server", "--backend", backend]


def start_worker(
    name: str,
    model_path: str,
    log_dir: Path,
    mode: str = "null",
    extra_args: list[str] | None = None,
    env: dict | None = None,
    backend: str = "torch",
    patched: bool = True,
) -> Proc:
    """One worker on a free port. backend="sglang" is real SGLang on its CPU path (the flags and
    environment of sglang_ext.sglang_backend.cpu are added)."""
    if backend == "sglang":
        from sglang_ext.sglang_backend import cpu

        extra_args = [*cpu.worker_flags(mode), *(extra_args or [])]
        env = {**cpu.worker_env(mode), **(env or {})}
    port = free_port()
    cmd = [
        *launcher(backend, patched),
        "--model-path",
        model_path,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--disaggregation-mode",
        mode,
        *(extra_args or []),
    ]
    bport = None
    if mode != "null":
        bport = free_port()
        cmd += [
            "--disaggregation-transfer-backend",
            "nixl",
            "--disaggregation-bootstrap-port",
            str(bport),
        ]
    proc = _spawn(name, cmd, f"http://127.0.0.1:{port}", log_dir, env)
    proc.bootstrap_port = bport
    return proc


def start_router(prefill: Proc, decode: Proc, log_dir: Path) -> Proc:
    port = free_port()
    cmd = router_argv(
        [(prefill.url, prefill.bootstrap_port)], [decode.url], "127.0.0.1", port, "127.0.0.1",
        free_port(),
        ["--policy", "round_robin", "--worker-startup-check-interval", "1", "--log-level", "info"],
    )
    return _spawn("router", cmd, f"http://127.0.0.1:{port}", log_dir, None)


def wait_healthy(procs: list[Proc], timeout: float = 120.0, path: str = "/health") -> None:
    deadline = time.monotonic() + timeout
    pending = list(procs)
    while pending:
        for p in list(pending):
            if p.popen.poll() is not None:
                raise RuntimeError(f"{p.name} exited with {p.popen.returncode}:\n{p.log_tail()}")
            try:
                if requests.get(p.url + path, timeout=2).status_code == 200:
                    pending.remove(p)
            except requests.RequestException:
                pass
        if pending and time.monotonic() > deadline:
            raise TimeoutError(
                f"{[p.name for p in pending]} not healthy after {timeout}s:\n"
                + "\n".join(p.log_tail() for p in pending)
            )
        if pending:
            time.sleep(0.3)


def stop(proc: Proc, timeout: float = 10.0) -> None:
    if proc.popen.poll() is None:
        stop_group(proc.popen.pid, grace_s=timeout)


def wait_router_ready(router: Proc, timeout: float = 60.0) -> None:
    """The router registers its workers in the background: wait until a generate goes through."""
    deadline = time.monotonic() + timeout
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    last = ""
    while time.monotonic() < deadline:
        try:
            r = requests.post(router.url + "/generate", json=body, timeout=30)
            if r.status_code == 200:
                return
            last = f"{r.status_code} {r.text[:200]}"
        except requests.RequestException as e:
            last = repr(e)
        time.sleep(0.5)
    raise TimeoutError(f"router not ready after {timeout}s: {last}\n{router.log_tail()}")


def stop_all(procs: list[Proc], timeout: float = 10.0) -> None:
    """SIGTERM every group at once, then wait (graceful shutdowns overlap instead of adding up)."""
    live = [p for p in procs if p.popen.poll() is None]
    for p in live:
        try:
            os.killpg(p.popen.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in live:
        stop(p, timeout)
