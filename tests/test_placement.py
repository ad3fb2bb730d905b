"""Worker placement (`--pin-cpus`): prefill workers from the first core, decode from the last."""

from __future__ import annotations

import os
import sys

from launch.procs import ProcSpec, start, stop_group
from planning.pack import plan_cpus


def test_plan_cpus_keeps_prefill_and_decode_apart():
    assert plan_cpus(["prefill", "decode"], [0, 1]) == [[0], [1]]
    assert plan_cpus(["prefill", "prefill", "decode", "decode"], [0, 1, 2, 3]) == [
        [0],
        [1],
        [3],
        [2],
    ]
    # More workers than cores: they share, round-robin, each side from its own end.
    assert plan_cpus(["prefill", "decode", "prefill", "decode"], [4, 5]) == [[4], [5], [5], [4]]


def test_a_started_process_runs_on_its_cores(tmp_path):
    core = max(os.sched_getaffinity(0))
    script = "import os, time; print(sorted(os.sched_getaffinity(0)), flush=True); time.sleep(30)"
    argv = [sys.executable, "-c", script]
    proc = start(ProcSpec("pinned", argv, None, cpus=[core]), tmp_path)
    try:
        assert os.sched_getaffinity(proc.pid) == {core}
    finally:
        stop_group(proc.pid)
