"""A detached deployment as a user runs one (`moa-pd up --detach` with MOA_PD_API_KEY, real
processes on loopback), checked for issue 21:

- the key: 401 in OpenAI's shape without it or with a wrong one, 200 with it, /health open; the
  key in no log, no command line (/proc/PID/cmdline), not in cluster.json or processes.json,
  and its file mode 0600;
- `moa-pd run --cluster D/cluster.json` with an edited copy of the served config (the runner
  reads the key file and registers the config; no path goes to the router);
- issue 30: a client cannot make the router read a file. Routed configs whose routing.scorer,
  then routing.profile, is an existing non-JSON file, a missing one, a FIFO (opening it would
  hang the router), a directory, a JSON file that is no scorer, a scorer the router did not
  load, /etc/shadow, ... are all refused at registration with one and the same answer, and
  inotify sees nothing in the probe folder opened or listed; the same routed config with its
  scorer inline is served and routes, and `moa-pd run --settings 6` with a routed config the
  router was not started with runs;
- a second `moa-pd up` on the folder refuses, naming the live processes and both ways out,
  and starts nothing; once the deployment is dead (SIGKILL, as a crash), `up` takes the folder
  over;
- `moa-pd down` stops everything (no process, group member or port left), a second `down` says
  nothing is running (rc 0), `down` on a folder never used is rc 2."""

from __future__ import annotations

import json
import os
import secrets
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from tiny_models import tiny_model_dir

from router.cluster import create_time
from tests.deployment_procs import (
    assert_ran_once_each,
    cluster_ports,
    descendants,
    kill_leftovers,
    leftovers,
    recorded,
    run_argv,
    tiny_config,
)

pytestmark = [pytest.mark.slow, pytest.mark.deployment]
ROOT = Path(__file__).resolve().parent.parent
KEY = "moa-test-" + secrets.token_hex(16)
MSGS = [{"role": "user", "content": "What is 2+3?"}]


def _cli(*argv: str, key: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("MOA_PD_API_KEY", None)
    if key:
        env["MOA_PD_API_KEY"] = KEY
    return subprocess.run(
        [sys.executable, "-m", "launch.cli", *argv],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _up(config: str, run_dir: Path) -> subprocess.CompletedProcess:
    return _cli("up", "--config", config, "--run-dir", str(run_dir), "--detach")


@pytest.fixture(scope="module")
def detached(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("safety")
    # The tiny random Llama (tests/tiny_models.py): the key, files and folders do not depend on
    # the weights.
    config, run_dir = tiny_config(tmp, model_path=tiny_model_dir("llama")), tmp / "dep"
    r = _up(config, run_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    state = {"run_dir": run_dir, "config": config, "tmp": tmp, "outputs": [r.stdout + r.stderr]}
    try:
        yield state
    finally:
        rows = recorded(run_dir)
        children = [c for row in rows for c in descendants(row["pid"])]
        _cli("down", "--run-dir", str(run_dir), key=False)
        kill_leftovers(rows, children)


def test_the_key_guards_the_endpoint_and_appears_nowhere(detached):
    run_dir = detached["run_dir"]
    cluster = json.loads((run_dir / "cluster.json").read_text())
    url = cluster["shell_router_url"]
    chat = {"model": "tree_3_1_tiny", "messages": MSGS, "max_tokens": 4}
    for headers in ({}, {"Authorization": "Bearer not-the-key"}):
        r = requests.post(url + "/v1/chat/completions", json=chat, headers=headers, timeout=30)
        assert r.status_code == 401, r.text
        assert r.json()["error"]["code"] == "invalid_api_key" and KEY not in r.text
    assert requests.get(url + "/v1/models", timeout=30).status_code == 401
    assert requests.get(url + "/health", timeout=30).status_code == 200
    auth = {"Authorization": f"Bearer {KEY}"}
    r = requests.post(url + "/v1/chat/completions", json=chat, headers=auth, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]

    key_file = Path(cluster["api_key_file"])
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and key_file.read_text() == KEY
    texts = {
        "cluster.json": (run_dir / "cluster.json").read_text(),
        "processes.json": (run_dir / "processes.json").read_text(),
        "moa-pd up's output": "".join(detached["outputs"]),
    }
    texts |= {str(p): p.read_text(errors="replace") for p in (run_dir / "logs").glob("*.log")}
    for row in recorded(run_dir):
        for pid in [row["pid"], *(p for p, _ in descendants(row["pid"]))]:
            try:
                texts[f"argv of pid {pid}"] = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
            except OSError:
                continue
    assert len(texts) > 8
    assert [name for name, text in texts.items() if KEY in text] == []


def test_run_with_an_edited_config_file_through_the_key(detached):
    run_dir, tmp = detached["run_dir"], detached["tmp"]
    raw = json.loads(Path(detached["config"]).read_text())
    raw["sampling"]["max_new_tokens"] = 5  # same name, other content: registered as a variant
    mine = tmp / "my.json"
    mine.write_text(json.dumps(raw))
    out = tmp / "run"
    # No MOA_PD_API_KEY here: the runner reads the key file cluster.json names.
    r = _cli(*run_argv(str(mine), out, "--cluster", str(run_dir / "cluster.json")), key=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert_ran_once_each(out)


def _scorer_doc() -> dict:
    """The fixture scorer cut to the two candidates of `_routed`'s pool."""
    doc = json.loads((ROOT / "tests" / "fixtures" / "scorer_pool_cpu.json").read_text())
    models = list(doc["candidates"].values())
    doc["candidates"] = {"c0": models[0], "c1": models[1]}
    return doc


def _routed(tiny: dict, name: str, scorer: object, **routing) -> dict:
    """The tiny tree's model and aggregator with a pool of two personas, routed (k=1)."""
    user = "Question:\n{question}\n\nCandidates:\n\n<|answers:pool|>\n\nAnswer."
    personas = ["Answer first, then justify briefly.", "Work step by step."]
    return {
        "name": name,
        "models": tiny["models"],
        "pool": {
            "candidates": [
                {"id": f"c{i}", "model": "smollm2", "persona": p} for i, p in enumerate(personas)
            ]
        },
        "routing": {"scorer": scorer, "k": 1, "model_sizes_b": {"smollm2": 0.1345}, **routing},
        "templates": {"agg": {"user": user}},
        "agents": [{"id": "final", "model": "smollm2", "template": "agg"}],
        "sampling": {"max_new_tokens": 6, "temperature": 0.0},
    }


def test_a_client_cannot_make_the_router_read_a_file(detached):
    from tests.file_watch import OpenWatch, fifo_tripwire

    run_dir, tmp = detached["run_dir"], detached["tmp"]
    url = json.loads((run_dir / "cluster.json").read_text())["shell_router_url"]
    auth = {"Authorization": f"Bearer {KEY}"}
    tiny = json.loads(Path(detached["config"]).read_text())
    probe = tmp / "probe"
    (probe / "sub").mkdir(parents=True)
    (probe / "plain.txt").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (probe / "not_scorer.json").write_text(json.dumps({"schema": "moa-pd.scorer/1"}))
    (probe / "sub" / "scorer.json").write_text(json.dumps(_scorer_doc()))
    refs = [
        *(str(probe / n) for n in ("plain.txt", "missing.json", "not_scorer.json", "sub")),
        str(probe / "sub" / "scorer.json"),
        str(probe / "fifo"),
        "/etc/passwd",
        "/etc/shadow",
        "/root/.bash_history",
        "/nonexistent/x.json",
    ]
    with fifo_tripwire(probe / "fifo", release_after_s=20), OpenWatch(probe, probe / "sub") as w:
        (probe / "sub" / "scorer.json").read_bytes()  # the watch sees an open: it works
        assert set(w.touched()) == {str(probe / "sub" / "scorer.json")}
        for field in ("scorer", "profile"):
            bodies = {}
            for ref in refs:
                raw = _routed(tiny, "probe", _scorer_doc())
                raw["routing"][field] = ref
                r = requests.post(url + "/v1/moa/configs", json=raw, headers=auth, timeout=15)
                bodies[ref] = (r.status_code, r.content)
            assert {status for status, _ in bodies.values()} == {400}, bodies
            assert len({body for _, body in bodies.values()}) == 1, bodies
            msg = json.loads(bodies[refs[0]][1])["error"]["message"]
            assert f"routing.{field}: a config registered over HTTP may name only" in msg, msg
            assert str(probe) not in msg and "No such file" not in msg
        assert w.touched() == []  # no file in the probe folder opened, read, or listed
    chat = {"model": "probe", "messages": MSGS, "max_tokens": 4}
    r = requests.post(url + "/v1/chat/completions", json=chat, headers=auth, timeout=30)
    assert r.status_code == 404, r.text  # nothing was registered

    # Sent inline, the same scorer is served, and routes a question.
    r = requests.post(
        url + "/v1/moa/configs", json=_routed(tiny, "routed_tiny", _scorer_doc()), headers=auth
    )
    assert r.status_code == 201, r.text
    run = {"question": "What is 2+3?", "config": "routed_tiny"}
    r = requests.post(url + "/v1/moa/run", json=run, headers=auth, timeout=300)
    assert r.status_code == 200, r.text
    assert len(r.json()["routing"]["chosen"]) == 1

    # moa-pd run --settings 6 on this router, which was not started with the routed config:
    # the runner sends its scorer inline.
    scorer = tmp / "my_scorer.json"
    scorer.write_text(json.dumps(_scorer_doc()))
    mine = tmp / "my_routed.json"
    mine.write_text(json.dumps(_routed(tiny, "my_routed", str(scorer))))
    out = tmp / "run6"
    argv = ["run", "--config", detached["config"], "--routed-config", str(mine),
            "--dataset", "gsm8k", "--num-samples", "2", "--settings", "6", "--out", str(out),
            "--cluster", str(run_dir / "cluster.json")]  # fmt: skip
    r = _cli(*argv, key=False)
    assert r.returncode == 0, r.stdout + r.stderr
    from experiments.results import read_results

    rows = read_results(out / "results.jsonl")
    assert len(rows) == 2 and all(row.ok and row.routing for row in rows), rows


def test_a_second_up_on_a_live_folder_is_refused(detached):
    run_dir = detached["run_dir"]
    before = recorded(run_dir)
    r = _up(detached["config"], run_dir)
    detached["outputs"].append(r.stdout + r.stderr)
    assert r.returncode == 1, r.stdout + r.stderr
    text = " ".join(r.stderr.split())
    assert "shell_router (pid" in text and f"moa-pd down --run-dir {run_dir}" in text, text
    assert "another folder (--run-dir)" in text, text
    assert recorded(run_dir) == before  # the live deployment's record is untouched
    assert all(create_time(row["pid"]) == row["create_time"] for row in before)


def test_a_dead_folder_is_taken_over_and_down_twice_leaves_nothing(detached):
    run_dir = detached["run_dir"]
    dead = recorded(run_dir)
    children = [c for row in dead for c in descendants(row["pid"])]
    for row in dead:  # the deployment crashes: every process gone, processes.json left behind
        os.killpg(row["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while leftovers(dead, children, []) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers(dead, children, []) == []
    r = _up(detached["config"], run_dir)
    detached["outputs"].append(r.stdout + r.stderr)
    assert r.returncode == 0, r.stdout + r.stderr
    procs = recorded(run_dir)
    assert procs and {p["pid"] for p in procs}.isdisjoint({p["pid"] for p in dead})
    children = [c for row in procs for c in descendants(row["pid"])]
    ports = cluster_ports(json.loads((run_dir / "cluster.json").read_text()))

    r = _cli("down", "--run-dir", str(run_dir), key=False)
    assert r.returncode == 0 and "stopped" in r.stderr, r.stdout + r.stderr
    assert leftovers(procs, children, ports) == []
    assert not (run_dir / "api_key").exists()
    r = _cli("down", "--run-dir", str(run_dir), key=False)
    assert r.returncode == 0 and "nothing is running" in r.stderr, r.stdout + r.stderr
    r = _cli("down", "--run-dir", str(detached["tmp"] / "never_used"), key=False)
    assert r.returncode == 2 and "nothing was started" in r.stderr, r.stdout + r.stderr
