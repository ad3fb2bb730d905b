"""SIGTERM and SIGINT (Ctrl-C) to a foreground `moa-pd run` (no --cluster: it starts its own
deployment) and to a foreground `moa-pd up`, as real processes: each stops within 10 s and
leaves no process it started (by pid, process group and descendant) and no port of its
cluster.json bound; results.jsonl stays valid JSONL and `--resume` finishes the run with every
(sample, setting) counted once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_models import tiny_model_dir

from launch.cli import main
from launch.procs import healthy
from tests.deployment_procs import (
    assert_ran_once_each,
    cluster_ports,
    descendants,
    kill_leftovers,
    leftovers,
    recorded,
    recorded_ports,
    run_argv,
    tiny_config,
)

pytestmark = [pytest.mark.slow, pytest.mark.deployment]


def _moa_pd(*argv: str, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "launch.cli", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def _until(pred, what: str, proc: subprocess.Popen, log: Path, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert proc.poll() is None, (
            f"moa-pd exited ({proc.returncode}) before {what}:\n"
            f"{log.read_text(errors='replace')[-3000:]}"
        )
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.05)


def _rows(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _stop(proc: subprocess.Popen, sig: signal.Signals, run_dir: Path, log: Path) -> int:
    """Send sig to the foreground command; it must exit within 10 s leaving nothing behind.
    Returns its exit code."""
    procs = recorded(run_dir)
    assert {p["name"] for p in procs} >= {"smollm2.prefill0", "smollm2.decode0"}, procs
    ports = recorded_ports(procs)
    if (run_dir / "cluster.json").exists():
        ports += cluster_ports(json.loads((run_dir / "cluster.json").read_text()))
    children = descendants(proc.pid)
    assert len(children) >= len(procs)
    t0 = time.monotonic()
    proc.send_signal(sig)
    try:
        rc = proc.wait(timeout=10)
        took = time.monotonic() - t0
        left = leftovers(procs, children, ports)
        assert not left, f"left running after {sig.name}: {left}"
        assert took < 10
    finally:
        proc.kill()
        proc.wait()
        kill_leftovers(procs, children)
    assert "stopping" in log.read_text() or "interrupted" in log.read_text(), log.read_text()
    return rc


def _stopped_run(config: str, sig: signal.Signals, tmp_path: Path) -> list[str]:
    """`moa-pd run` with its own deployment, stopped by sig after its first row. Returns its
    argv (to resume it)."""
    out = tmp_path / f"run_{sig.name}"
    argv = run_argv(config, out)
    log = tmp_path / f"run_{sig.name}.log"
    run = _moa_pd(*argv, log=log)
    _until(lambda: _rows(out / "results.jsonl") >= 1, "first row", run, log)
    assert _stop(run, sig, out / "deployment", log) == 130, log.read_text()
    assert "continue with: moa-pd run" in log.read_text() and "--resume" in log.read_text()
    lines = (out / "results.jsonl").read_text().splitlines()
    assert 1 <= len(lines) < 4
    for line in lines:
        json.loads(line)  # valid JSONL: no torn last line
    return argv


def _resumed(argv: list[str], cluster: Path) -> None:
    """--resume on a running deployment finishes the run: every (sample, setting) once."""
    assert main([*argv, "--resume", "--cluster", str(cluster)]) == 0
    assert_ran_once_each(Path(argv[argv.index("--out") + 1]))


def test_sigterm_and_sigint_stop_foreground_run_and_up_clean(tmp_path, monkeypatch):
    """Four stops, three deployments (each takes ~30 s to start here): `moa-pd run` stopped by
    SIGTERM and by SIGINT after its first row; a serving `moa-pd up` finishes both runs with
    --resume and is stopped by SIGTERM; a second `moa-pd up` is stopped by SIGINT (Ctrl-C)
    while its workers are still loading, where a user most often presses it. The workers serve
    the tiny random Llama (tests/tiny_models.py): stopping does not depend on the weights, and
    SmolLM2-135M's rows cost ~15 s of CPU here, most of it in the two resumes."""
    monkeypatch.setenv("COLUMNS", "10000")  # rich must not wrap the messages checked here
    config = tiny_config(tmp_path, model_path=tiny_model_dir("llama"))
    runs = [_stopped_run(config, sig, tmp_path) for sig in (signal.SIGTERM, signal.SIGINT)]

    dep, log = tmp_path / "up", tmp_path / "up.log"
    up = _moa_pd("up", "--config", config, "--run-dir", str(dep), log=log)
    try:
        _until(lambda: "serving" in log.read_text(), "serving", up, log)
        cluster = json.loads((dep / "cluster.json").read_text())
        assert healthy(cluster["shell_router_url"] + "/health")
        for argv in runs:
            _resumed(argv, dep / "cluster.json")
    finally:
        assert _stop(up, signal.SIGTERM, dep, log) == 0, log.read_text()

    dep, log = tmp_path / "up_starting", tmp_path / "up_starting.log"
    up = _moa_pd("up", "--config", config, "--run-dir", str(dep), log=log)
    _until(lambda: len(recorded(dep)) >= 2, "workers started", up, log)
    assert _stop(up, signal.SIGINT, dep, log) == 130, log.read_text()
    assert not (dep / "cluster.json").exists()  # it was stopped while still starting
