"""A plan over two "nodes" on this machine (two run dirs, on 127.0.0.1 and 127.0.0.2: Linux
routes all of 127/8 to lo): `moa-pd up --plan --node` starts the tiny model's prefill worker on
one and its decode worker on the other, each part names only its own address, `--join` starts
the routers over both, and a question through the shell router is answered, so the KV crossed
between the two addresses over NIXL (reference engine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
from tiny_models import tiny_model_dir

from tests.deployment_procs import tiny_config

FIXTURE = Path(__file__).parent / "fixtures" / "plan_two_nodes.json"
HOSTS = {"a": "127.0.0.1", "b": "127.0.0.2"}
CLI = [sys.executable, "-m", "launch.cli"]


def _hosts(part: dict) -> set[str]:
    """The host of every URL a node part names."""
    urls = [u for m in part["models"].values() for u in (*m["prefill_urls"], *m["decode_urls"])]
    urls += [u for m in part["models"].values() for u in m["processes"]]
    return {urlsplit(u).hostname for u in urls}


@pytest.mark.slow
@pytest.mark.deployment
def test_a_plan_over_two_nodes_answers_through_one_shell_router(tmp_path):
    config = tiny_config(tmp_path, model_path=tiny_model_dir("llama"))
    up = [*CLI, "up", "--plan", str(FIXTURE), "--config", config, "--detach"]
    dirs = {n: tmp_path / n for n in ("a", "b", "routers")}
    try:
        nodes = [
            subprocess.Popen(
                [*up, "--node", n, "--run-dir", str(dirs[n])],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for n in HOSTS
        ]
        outputs = [p.communicate(timeout=60)[0] for p in nodes]
        assert [p.returncode for p in nodes] == [0, 0], "\n".join(outputs)
        parts = {n: json.loads((dirs[n] / f"cluster.{n}.json").read_text()) for n in HOSTS}
        for n, host in HOSTS.items():
            assert _hosts(parts[n]) == {host}, parts[n]  # nothing of the other node's address
            assert parts[n]["host"] == host
        assert parts["a"]["models"]["smollm2"]["decode_urls"] == []
        assert parts["b"]["models"]["smollm2"]["prefill_urls"] == []
        join = [*up, "--join", str(dirs["a"]), "--join", str(dirs["b"])]
        r = subprocess.run(
            [*join, "--run-dir", str(dirs["routers"])],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        cluster = json.loads((dirs["routers"] / "cluster.json").read_text())
        model = cluster["models"]["smollm2"]
        assert [urlsplit(u).hostname for u in model["prefill_urls"]] == ["127.0.0.1"]
        assert [urlsplit(u).hostname for u in model["decode_urls"]] == ["127.0.0.2"]
        assert model["prefill_shares"] == model["decode_shares"] == [1.0]
        reply = requests.post(
            cluster["shell_router_url"] + "/v1/chat/completions",
            timeout=60,
            json={"model": "tree_3_1_tiny", "messages": [{"role": "user", "content": "2+3?"}]},
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"]
        metrics = requests.get(cluster["shell_router_url"] + "/metrics", timeout=10).text
        # 3 leaves and the aggregator, each on the one decode worker, by the plan's split.
        assert 'moa_worker_requests_total{model="smollm2",replica="0",role="decode"} 4.0' in metrics
    finally:
        # All three at once: each waits for its processes to exit.
        downs = [
            subprocess.Popen([*CLI, "down", "--run-dir", str(d)])
            for d in reversed(dirs.values())
            if (d / "processes.json").exists()
        ]
        for p in downs:
            p.wait(timeout=60)
