"""launch/slurm/moa_pd.sbatch with Slurm's commands faked (scontrol, srun, getent on PATH) and a
fake moa-pd that records its arguments: one `up --node` per allocated host, in the plan's node
order, each bound to its host's address; the join on the first host's address once every part
is written; a node whose step dies stops the job with its log named."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "launch" / "slurm" / "moa_pd.sbatch"
PLAN = Path(__file__).parent / "fixtures" / "plan_two_nodes.json"
FAKES = {
    "scontrol": 'printf "gpu-01\\ngpu-02\\n"',
    "getent": 'case $2 in gpu-01) echo "10.0.0.1 STREAM $2";; gpu-02) echo "10.0.0.2 STREAM $2";; esac',
    # srun -w HOST CMD...: run CMD here.
    "srun": 'while [[ $1 == -* ]]; do [[ $1 == -w ]] && shift; shift; done; exec "$@"',
    # up --node N --run-dir D: write D/cluster.N.json and serve; up --join: record and return.
    "moa-pd": """echo "$*" >> "$CALLS"
node= dir=
while (( $# )); do case $1 in --node) node=$2;; --run-dir) dir=$2;; esac; shift; done
[[ -n $node && $node == "$FAIL_NODE" ]] && exit 3
[[ -n $node ]] && { echo '{}' > "$dir/cluster.$node.json"; exec sleep 20; }
exit 0""",
}


def _run(tmp_path: Path, fail_node: str = "") -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKES.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "gpu-[01-02]",
        "SLURM_JOB_ID": "7",
        "CALLS": str(tmp_path / "calls"),
        "FAIL_NODE": fail_node,
        "MOA_PD_POLL_S": "0.1",
    }
    base = tmp_path / "runs"
    r = subprocess.run(
        ["bash", str(SCRIPT), str(PLAN), str(base)],
        env=env, capture_output=True, text=True, timeout=20, check=False,
    )  # fmt: skip
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return r, calls


@pytest.mark.parametrize("fail_node", ["", "b"])
def test_one_node_per_host_then_the_join_on_the_first(tmp_path, fail_node):
    r, calls = _run(tmp_path, fail_node)
    base = tmp_path / "runs"
    up = f"up --plan {PLAN}"
    node_a = f"{up} --node a --host 10.0.0.1 --run-dir {base}/a"
    node_b = f"{up} --node b --host 10.0.0.2 --run-dir {base}/b"
    if fail_node:
        assert r.returncode == 1 and f"node b (gpu-02) stopped; see {base}/b/up.log" in r.stderr
        assert sorted(calls) == [node_a, node_b]
        return
    join = f"{up} --join {base}/a --join {base}/b --host 10.0.0.1 --run-dir {base}/routers"
    assert sorted(calls) == sorted([node_a, node_b, join]), calls
    assert calls[-1] == join  # after both parts were written
    assert "node a up on gpu-01" in r.stdout and "node b up on gpu-02" in r.stdout
