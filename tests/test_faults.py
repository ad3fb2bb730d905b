"""Faults on a real deployment (SmolLM2 PD workers, sglang-router, shell router on loopback),
driven through `moa-pd run` as a user would: kill -9 of the decode worker, the prefill worker
and the shell router during a run (the run stops within seconds naming what died, exits 1, and
`--resume` on a fresh deployment completes with every (sample, setting) counted once).

The topology is tree_3_1_cpu with 6-token agents, as a user's own config file under another
name, so the runner must ask the shell router for it by its `name`. Its workers serve the tiny
random Llama of tests/tiny_models.py: what dies and how the run reacts does not depend on the
weights, and SmolLM2-135M made each of the three deployments ~10 s slower to start and run."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tiny_models import tiny_model_dir

from experiments.results import read_results
from launch.cli import main
from launch.commands import make_stack
from launch.procs import start, wait_healthy
from launch.stack import Stack
from tests.deployment_procs import assert_ran_once_each, run_argv
from tests.deployment_procs import tiny_config as write_tiny_config
from tests.text_checks import said

pytestmark = [pytest.mark.slow, pytest.mark.deployment]


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> str:
    return write_tiny_config(tmp_path_factory.mktemp("cfg"), model_path=tiny_model_dir("llama"))


def _up(config: str, run_dir: Path) -> Stack:
    """A deployment of `config`, not started yet (`up()` / `down()`)."""
    return make_stack([config], "torch", run_dir, "127.0.0.1")


def _proc(stack: Stack, suffix: str):
    return next(p for p in stack.procs if p.spec.name.endswith(suffix))


class _Run:
    """`moa-pd run` in a thread (as the CLI runs it), against a running deployment."""

    def __init__(self, config: str, stack: Stack, out: Path, *extra: str) -> None:
        self.out = out
        self.argv = run_argv(config, out, "--cluster", str(stack.cluster_path), *extra)
        self.code: int | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        self.code = main(self.argv)

    def rows(self) -> int:
        path = self.out / "results.jsonl"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def wait_rows(self, n: int, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while self.rows() < n:
            assert self.thread.is_alive(), f"the run ended before {n} rows (code {self.code})"
            assert time.monotonic() < deadline, f"fewer than {n} rows after {timeout} s"
            time.sleep(0.05)

    def join(self, timeout: float) -> int:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the run did not end within {timeout} s"
        return self.code


def _kill_during_run(config: str, stack: Stack, out: Path, victim, capfd) -> str:
    """Start a run, kill -9 `victim` once the first row is written; the run must end with
    exit code 1 within 10 s. Returns what it printed."""
    run = _Run(config, stack, out)
    run.wait_rows(1)
    os.kill(victim.pid, signal.SIGKILL)
    t0 = time.monotonic()
    assert run.join(30) == 1
    assert time.monotonic() - t0 < 10
    err = said(capfd.readouterr().err)
    assert "--resume" in err
    # What was recorded before the kill is a result; nothing after it is.
    rows = read_results(out / "results.jsonl")
    assert rows[0].ok and len(rows) < 4
    return err


def _resume(config: str, stack: Stack, out: Path) -> None:
    """--resume completes the run: every (sample, setting) once, none failed."""
    assert _Run(config, stack, out, "--resume").join(120) == 0
    assert_ran_once_each(out)


def test_kill_9_of_each_process_fails_fast_and_resume_completes(tiny_config, tmp_path, capfd):
    a, b, c = (_up(tiny_config, tmp_path / f"dep_{x}") for x in "abc")
    # Each fresh deployment starts in the background while the one before serves its run and its
    # kill (a start is most of a deployment's time here). One pool thread starts both: it lives
    # until the `with` ends, and the workers' parent-death signal follows the thread that started
    # them. down() is idempotent; the pool exits first, so a start under way ends before its down.
    with contextlib.ExitStack() as downs, ThreadPoolExecutor(1) as pool:
        for stack in (a, b, c):
            downs.callback(stack.down)
        a.up()
        b_up = pool.submit(b.up)
        # 1. The decode worker dies: the run stops naming it and its log.
        err = _kill_during_run(tiny_config, a, tmp_path / "r1", _proc(a, ".decode0"), capfd)
        assert "smollm2 decode0" in err and "smollm2.decode0.log" in err
        a.down()
        b_up.result()
        c_up = pool.submit(c.up)
        _resume(tiny_config, b, tmp_path / "r1")
        # 2. The prefill worker dies.
        err = _kill_during_run(tiny_config, b, tmp_path / "r2", _proc(b, ".prefill0"), capfd)
        assert "smollm2 prefill0" in err and "smollm2.prefill0.log" in err
        b.down()
        c_up.result()
        _resume(tiny_config, c, tmp_path / "r2")
        # 3. The shell router dies: the runner says so; a new shell router serves the resume.
        shell = _proc(c, "shell_router")
        err = _kill_during_run(tiny_config, c, tmp_path / "r3", shell, capfd)
        assert "shell router" in err and "does not answer" in err
        shell.popen.wait()
        c.procs.remove(shell)
        again = start(c.shell_router_spec(), c.run_dir / "logs")
        c.procs.append(again)
        wait_healthy([again], 60)
        _resume(tiny_config, c, tmp_path / "r3")
