"""Launcher pieces that need no model: command lines, GPU choice, start-up faults, `down`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from launch.procs import LaunchError, ProcSpec, start, stop_group, wait_healthy
from launch.run_dir import down_run_dir
from launch.stack import Stack
from launch.worker_cmd import server_arg_flags, worker_argv
from planning.models import merge_models
from planning.pack import PlanError
from router.cluster import create_time
from router.config import ModelSpec
from router.config_loader import load_config


def test_server_args_become_sglang_flags():
    flags = server_arg_flags(
        {
            "mem_fraction_static": 0.8,
            "enable_metrics": True,
            "disable_radix_cache": False,
            "schedule_conservativeness": 0.3,
        }
    )
    assert flags == [
        "--mem-fraction-static",
        "0.8",
        "--enable-metrics",
        "--schedule-conservativeness",
        "0.3",
    ]


def test_worker_argv_prefill_and_decode():
    spec = ModelSpec(model_path="m", server_args={"torch": {"page_size": 16}})
    argv = worker_argv("torch", "/models/m", spec, "prefill", "127.0.0.1", 30000, 8998)
    joined = " ".join(argv)
    assert "-m sglang_ext.launch_server --backend torch --model-path /models/m" in joined
    assert "--disaggregation-mode prefill --disaggregation-transfer-backend nixl" in joined
    assert "--disaggregation-bootstrap-port 8998" in joined and argv[-2:] == ["--page-size", "16"]
    argv = worker_argv("sglang", "Qwen/Qwen3-0.6B", spec, "decode", "127.0.0.1", 30001, None)
    assert "--disaggregation-bootstrap-port" not in argv
    assert "--base-gpu-id" not in argv  # a GPU comes with its placement (placement_flags)


def test_configs_sharing_a_model_merge_and_conflicts_fail():
    tree, dense = load_config("tree_9_3_1_cpu"), load_config("all_to_all_9_9_1_cpu")
    assert list(merge_models([tree, dense])) == ["smollm2"]
    other = tree.model_copy(update={"models": {"smollm2": ModelSpec(model_path="/elsewhere")}})
    with pytest.raises(PlanError, match="defined differently"):
        merge_models([tree, other])


def test_a_model_no_agent_uses_is_refused_before_anything_starts(tmp_path):
    """Its workers would get no pool (--max-total-tokens 0 where placed), on either backend."""
    tree = load_config("tree_3_1_cpu")
    spare = tree.model_copy(update={"models": {**tree.models, "spare": tree.models["smollm2"]}})
    msg = f"{tree.name}: model 'spare' is declared but no agent uses it; remove it from models"
    with pytest.raises(PlanError, match=msg):
        merge_models([spare])
    # Used by an agent of another config deployed with it: fine.
    assert list(merge_models([tree])) == ["smollm2"]
    stack = Stack([spare], [], "torch", tmp_path)
    with pytest.raises(LaunchError, match="no agent uses it"):
        stack.up()
    assert stack.procs == [] and not (tmp_path / "processes.json").exists()


def test_worker_dying_at_startup_shows_its_log_tail(tmp_path):
    spec = ProcSpec(
        "dies",
        [
            sys.executable,
            "-c",
            ("print('loading weights'); raise SystemExit('model file is corrupt')"),
        ],
        "http://127.0.0.1:9/health",
    )
    proc = start(spec, tmp_path)
    with pytest.raises(LaunchError) as info:
        wait_healthy([proc], timeout_s=20)
    msg = str(info.value)
    assert "dies exited with code 1 during start-up" in msg
    assert "model file is corrupt" in msg and "loading weights" in msg


def test_health_timeout_names_the_process(tmp_path):
    spec = ProcSpec(
        "sleeper",
        [sys.executable, "-c", "import time; time.sleep(30)"],
        "http://127.0.0.1:9/health",
    )
    proc = start(spec, tmp_path)
    try:
        with pytest.raises(LaunchError, match="not healthy after 1 s: sleeper"):
            wait_healthy([proc], timeout_s=1)
    finally:
        stop_group(proc.pid)
    assert proc.popen.poll() is not None


def test_down_stops_what_up_started_and_nothing_else(tmp_path):
    ours = start(
        ProcSpec("ours", [sys.executable, "-c", "import time; time.sleep(60)"], None), tmp_path
    )
    stranger = start(
        ProcSpec("stranger", [sys.executable, "-c", "import time; time.sleep(60)"], None), tmp_path
    )
    rows = [
        {"name": "ours", "pid": ours.pid, "create_time": create_time(ours.pid)},
        # A recorded pid whose start time differs (the pid was reused) is left alone.
        {
            "name": "reused",
            "pid": stranger.pid,
            "create_time": create_time(stranger.pid) - 1,
        },
    ]
    (tmp_path / "processes.json").write_text(json.dumps(rows))
    try:
        # Only what still runs as we started it is stopped and named; the reused pid is not ours.
        assert down_run_dir(tmp_path) == ["ours"]
        deadline = time.monotonic() + 5
        while ours.popen.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ours.popen.poll() is not None
        assert stranger.popen.poll() is None
    finally:
        stop_group(stranger.pid)
    assert not (tmp_path / "processes.json").exists()
    assert down_run_dir(tmp_path) == []  # down twice: nothing is running, not an error
    with pytest.raises(LaunchError, match="nothing was started"):
        down_run_dir(tmp_path / "never_used")


def test_processes_recorded_by_an_older_moa_pd_are_refused_not_forgotten(tmp_path):
    """The previous release recorded `start_ticks`, not `create_time`: `down` must not call
    those processes gone (marking the folder stopped while they run), nor `up` take it over."""
    from launch.run_dir import claim

    live = start(
        ProcSpec("w", [sys.executable, "-c", "import time; time.sleep(60)"], None), tmp_path
    )
    rows = [{"name": "m.decode0", "pid": live.pid, "start_ticks": 12345, "log": "x"}]
    (tmp_path / "processes.json").write_text(json.dumps(rows))
    try:
        for attempt in (down_run_dir, claim):
            with pytest.raises(LaunchError) as e:
                attempt(tmp_path)
            msg = str(e.value)
            assert "older moa-pd" in msg and f"m.decode0 (pid {live.pid})" in msg
            assert f"kill {live.pid}" in msg and f"ps -o pid,lstart,cmd -p {live.pid}" in msg
            assert (tmp_path / "processes.json").exists()
            assert not (tmp_path / "processes.stopped.json").exists()
            assert live.popen.poll() is None
    finally:
        stop_group(live.pid)
    # The refusal released its lock: once the file is dealt with, the folder can be used.
    (tmp_path / "processes.json").unlink()
    claim(tmp_path).close()


def test_a_run_dir_with_a_live_deployment_is_refused_a_dead_one_taken_over(tmp_path):
    from launch.run_dir import claim

    live = start(
        ProcSpec("w", [sys.executable, "-c", "import time; time.sleep(60)"], None), tmp_path
    )
    rows = [{"name": "m.decode0", "pid": live.pid, "create_time": create_time(live.pid)}]
    (tmp_path / "processes.json").write_text(json.dumps(rows))
    try:
        with pytest.raises(LaunchError) as e:
            claim(tmp_path)
        msg = str(e.value)
        assert f"m.decode0 (pid {live.pid})" in msg and f"moa-pd down --run-dir {tmp_path}" in msg
        assert "--run-dir)" in msg
        (tmp_path / "other").mkdir()
        lock = claim(tmp_path / "other")
        # While one `up` holds a folder, a second is refused even before processes are recorded.
        with pytest.raises(LaunchError, match="running deployment"):
            claim(tmp_path / "other")
        lock.close()
    finally:
        stop_group(live.pid)
    lock = claim(tmp_path)  # every recorded process is gone: the folder is taken over
    lock.close()
    assert not (tmp_path / "processes.json").exists()
    assert (tmp_path / "processes.stopped.json").exists()


def test_missing_model_path_fails_before_anything_starts(tmp_path):
    cfg = load_config("tree_3_1_cpu")
    bad = cfg.model_copy(update={"models": {"smollm2": ModelSpec(model_path="/no/such/model")}})
    stack = Stack([bad], [], "torch", tmp_path)
    with pytest.raises(LaunchError, match="/no/such/model"):
        stack.up()
    assert stack.procs == [] and not Path(tmp_path / "processes.json").exists()


def _run_script(script: str, tmp_path: Path, env: dict) -> list[str]:
    """Run a researcher script with MOA_PD pointing at a recorder; returns the calls it made."""
    import os
    import subprocess

    log = tmp_path / "calls"
    recorder = tmp_path / "moa-pd"
    recorder.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    recorder.chmod(0o755)
    root = Path(__file__).resolve().parent.parent
    subprocess.run(
        ["bash", str(root / "launch" / script)],
        check=True,
        cwd=tmp_path,
        env={**os.environ, "MOA_PD": str(recorder), **env},
    )
    return log.read_text().splitlines()


def test_experiment_script_reads_its_environment(tmp_path):
    calls = _run_script(
        "run_servers_all_pd_w_experiment.sh",
        tmp_path,
        {
            "CONFIG_PATH": "tree_9_3_1_homo",
            "DENSE_CONFIG_PATH": "all_to_all_9_9_1_homo",
            "DATASET": "math500",
            "NUM_SAMPLES": "7",
            "QUESTION_BATCH_SIZE": "4",
            "BACKEND": "sglang",
            "OUT": "runs/x",
        },
    )
    assert calls[0] == (
        "up --config tree_9_3_1_homo --config all_to_all_9_9_1_homo --backend "
        "sglang --run-dir runs/x/deployment --detach"
    )
    assert calls[1] == (
        "run --config tree_9_3_1_homo --dense-config all_to_all_9_9_1_homo "
        "--dataset math500 --num-samples 7 --settings 1,2,3,4 --concurrency 4 "
        "--cluster runs/x/deployment/cluster.json --out runs/x"
    )
    assert calls[2] == "down --run-dir runs/x/deployment"  # torn down on exit


def test_experiment_script_without_dense_config_skips_setting_1(tmp_path):
    calls = _run_script(
        "run_servers_all_pd_w_experiment.sh", tmp_path, {"DENSE_CONFIG_PATH": "", "OUT": "o"}
    )
    assert "--dense-config" not in calls[1] and "--settings 2,3,4" in calls[1]


def test_servers_script_passes_every_config(tmp_path):
    calls = _run_script(
        "run_servers_all_pd.sh",
        tmp_path,
        {"CONFIG_PATH": "tree_3_1_cpu all_to_all_9_9_1_cpu", "OUT": "o"},
    )
    assert calls == [
        (
            "up --config tree_3_1_cpu --config all_to_all_9_9_1_cpu --backend torch "
            "--run-dir o --host 127.0.0.1"
        )
    ]


def test_priority_scheduling_in_server_args_makes_the_router_send_priority(tmp_path):
    from router.cluster import ClusterSpec

    cfg = load_config("tree_3_1_cpu")
    ((name, spec),) = cfg.models.items()
    prio = spec.model_copy(update={"server_args": {"torch": {"enable_priority_scheduling": True}}})
    for model, expected in ((spec, False), (prio, True)):
        stack = Stack([cfg.model_copy(update={"models": {name: model}})], [], "torch", tmp_path)
        stack.plan()
        argv = [a for s in stack.worker_specs() for a in s.argv]
        assert ("--enable-priority-scheduling" in argv) is expected
        cluster = ClusterSpec.model_validate(stack.cluster())
        assert cluster.sends_priority(name) is expected
        # A cluster-wide value overrides what the workers run with (benchmark ladders).
        forced = cluster.model_copy(update={"priority_scheduling": not expected})
        assert forced.sends_priority(name) is (not expected)


def test_cluster_names_each_workers_compute_device(tmp_path):
    """cluster.json tells the router's warm-up gate which workers share a device: unpinned CPU
    workers share the cores; pinned ones each have their own; a config naming an unknown device
    is refused."""
    import os

    from router.cluster import ClusterSpec

    cfg = load_config("tree_3_1_cpu")
    (name,) = cfg.models
    for pin, expected in ((False, ["cpu", "cpu"]), (True, None)):
        stack = Stack([cfg], [], "torch", tmp_path, pin_cpus=pin)
        stack.plan()
        stack.worker_specs()
        cluster = ClusterSpec.model_validate(stack.cluster())
        m = cluster.models[name]
        devices = m.prefill_devices + m.decode_devices
        if expected:
            assert devices == expected
            assert cluster.devices == {"cpu": len(os.sched_getaffinity(0))}
        else:
            assert len(set(devices)) == 2 and all(d.startswith("cpu:") for d in devices)
        assert cluster.warmup_gate_scope == "device"
    bad = {**stack.cluster(), "devices": {}}
    with pytest.raises(ValueError, match="does not list"):
        ClusterSpec.model_validate(bad)
