"""Real worker and router processes for integration tests, started through launch/ (the command
lines of launch.worker_cmd, launch.procs.start/wait_healthy/stop_groups): each in its own process
group with OMP_NUM_THREADS=1, a log file, and SIGTERM when the test process dies. Used by the
fixtures in conftest.py and sglang_real.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from launch import procs as launch_procs
from launch.ports import free_port
from launch.procs import stop_groups, wait_routable
from launch.worker_cmd import router_argv, server_argv

REPO = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
# Offline and single-threaded, whatever the caller's shell has; the repo importable from any cwd.
TEST_ENV = {
    "MKL_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONPATH": str(REPO),
}


@dataclass
class Proc:
    name: str
    launched: launch_procs.Proc
    url: str
    bootstrap_port: int | None = None

    @property
    def popen(self):
        return self.launched.popen

    @property
    def log(self) -> Path:
        return self.launched.log_path

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


def _start(
    name: str, argv: list[str], port: int, log_dir: Path, env: dict | None, ports: list[int]
) -> Proc:
    url = f"http://{HOST}:{port}"
    spec = launch_procs.ProcSpec(
        name, argv, url + "/health", env={**TEST_ENV, **(env or {})}, ports=ports
    )
    return Proc(name, launch_procs.start(spec, log_dir), url)


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
    environment of sglang_ext.sglang_backend.cpu are added); patched=False starts it with
    SGLang's own launcher instead of ours (the negative control)."""
    if backend == "sglang":
        from sglang_ext.sglang_backend import cpu

        extra_args = [*cpu.worker_flags(mode), *(extra_args or [])]
        env = {**cpu.worker_env(mode), **(env or {})}
    port = free_port()
    bport = free_port() if mode != "null" else None
    argv = server_argv(
        backend, model_path, mode, HOST, port, bport, extra=extra_args or (), patched=patched
    )
    proc = _start(name, argv, port, log_dir, env, [port] + ([bport] if bport else []))
    proc.bootstrap_port = bport
    return proc


def start_router(prefill: Proc, decode: Proc, log_dir: Path) -> Proc:
    port = free_port()
    argv = router_argv(
        [(prefill.url, prefill.bootstrap_port)],
        [decode.url],
        HOST,
        port,
        HOST,
        free_port(),
        ["--policy", "round_robin", "--worker-startup-check-interval", "1", "--log-level", "info"],
    )
    return _start("router", argv, port, log_dir, None, [port])


def wait_healthy(procs: list[Proc], timeout: float = 120.0) -> None:
    """Every proc answers 200 on /health; a LaunchError with its log tail if one exits first."""
    launch_procs.wait_healthy([p.launched for p in procs], timeout)


def wait_router_ready(router: Proc, timeout: float = 120.0) -> None:
    """The router registers its workers in the background: wait until it routes a request."""
    wait_routable(router.url, timeout, router.launched)


def stop(proc: Proc, timeout: float = 10.0) -> None:
    stop_all([proc], timeout)


def stop_all(procs: list[Proc], timeout: float = 10.0) -> None:
    """SIGTERM every group at once, then SIGKILL what is left (shutdowns overlap)."""
    stop_groups([p.popen.pid for p in procs], timeout)
