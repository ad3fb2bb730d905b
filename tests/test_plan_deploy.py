"""`moa-pd up --plan`: a bad plan is refused naming its JSON path, a plan's node starts only its
workers on its own host, a one-node plan starts whole with the plan's replicas, pins and pools,
and node parts merge in replica order. No process is started (Stack.plan and worker_specs only).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from launch.cluster_part import NodePart, merge_parts
from launch.plan_deploy import check_plan
from launch.plan_up import make_plan_stack
from launch.procs import LaunchError
from planning.models import merge_models
from planning.plan_file import DeploymentPlan
from planning.pool_need import running_needs
from router.config_loader import load_config
from sglang_ext.server_args import DEFAULT_MAX_RUNNING_REQUESTS

FIXTURE = Path(__file__).parent / "fixtures" / "plan_two_nodes.json"
MODELS = merge_models([load_config("tree_3_1_cpu")])


def _raw() -> dict:
    return json.loads(FIXTURE.read_text())


def _write(tmp_path: Path, raw: dict) -> str:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(raw))
    return str(path)


def _one_node(raw: dict) -> dict:
    """The fixture on one node, with two prefill replicas splitting 3:1 and pinned cores."""
    raw["nodes"] = raw["nodes"][:1]
    prefill, decode = raw["workers"]
    decode["node"] = "a"
    raw["workers"] = [
        {**prefill, "share": 0.75, "cpus": [0]},
        {**prefill, "replica": 1, "share": 0.25, "cpus": [1], "pool_tokens": 4096},
        decode,
    ]
    return raw


def _mutated(edit) -> DeploymentPlan:
    raw = _raw()
    edit(raw)
    return DeploymentPlan.model_validate(raw)


@pytest.mark.parametrize(
    ("edit", "where", "what"),
    [
        (lambda r: r["workers"][1].update(node="c"), "workers[1].node", "unknown node 'c'"),
        (lambda r: r["workers"][0].update(model="qwen"), "workers[0].model", "'qwen'"),
        (
            lambda r: r["workers"].append({**r["workers"][1], "replica": 1, "share": 0.5}),
            "workers[1,2].share",
            "sum to 1.5",
        ),
        (
            lambda r: r["workers"].append({**r["workers"][1]}),
            "workers[2]",
            "smollm2.decode0 is also workers[1]",
        ),
        (
            lambda r: r["workers"].append({**r["workers"][1], "replica": 2, "share": 0.5}),
            "workers[1,2].replica",
            "number them 0..1",
        ),
        (lambda r: r["nodes"].append({**r["nodes"][0]}), "nodes[2].name", "also nodes[0]"),
        (lambda r: r["workers"][0].update(gpus=[0, 1]), "workers[0].gpus", "for tp 1"),
        (lambda r: r["workers"][1].update(gpus=[0]), "workers[1].gpus", "runs on CPU"),
        (
            lambda r: [
                w.update(role="prefill", replica=i, share=0.5) for i, w in enumerate(r["workers"])
            ],
            "workers",
            "model 'smollm2' has no decode worker",
        ),
    ],
)
def test_a_bad_plan_names_its_json_path(edit, where, what):
    with pytest.raises(LaunchError) as e:
        check_plan(_mutated(edit), "plan.json", MODELS)
    assert f"plan plan.json: {where}:" in str(e.value) and what in str(e.value), str(e.value)


def test_the_fixture_is_a_good_plan():
    check_plan(DeploymentPlan.load(FIXTURE), str(FIXTURE), MODELS)


def test_an_invalid_file_and_a_wrong_node_are_clear(tmp_path):
    raw = _raw()
    raw["workers"][0]["share"] = 0
    with pytest.raises(LaunchError, match=r"invalid: workers\.0\.share: Input should be greater"):
        make_plan_stack(_write(tmp_path, raw), None, None, tmp_path / "d")
    with pytest.raises(LaunchError, match="--node c: no such node; it has a, b"):
        make_plan_stack(str(FIXTURE), None, None, tmp_path / "d", node="c")
    with pytest.raises(LaunchError, match="spans nodes a, b: start each node's workers"):
        make_plan_stack(str(FIXTURE), None, None, tmp_path / "d")
    with pytest.raises(LaunchError, match="is for --backend torch, not sglang"):
        make_plan_stack(str(FIXTURE), None, "sglang", tmp_path / "d", node="a")


def test_each_node_starts_its_own_workers_on_its_own_host(tmp_path):
    stacks = {n: make_plan_stack(str(FIXTURE), None, None, tmp_path / n, node=n) for n in "ab"}
    for s in stacks.values():
        s.plan()
    specs = {n: s.worker_specs() for n, s in stacks.items()}
    assert [s.name for s in specs["a"]] == ["smollm2.prefill0"]
    assert [s.name for s in specs["b"]] == ["smollm2.decode0"]
    for node, host, other in (("a", "127.0.0.1", "127.0.0.2"), ("b", "127.0.0.2", "127.0.0.1")):
        (spec,) = specs[node]
        argv = spec.argv
        assert argv[argv.index("--host") + 1] == host
        assert argv[argv.index("--max-total-tokens") + 1] == "8192"
        part = json.dumps(stacks[node].part())
        assert f"//{host}:" in part and other not in part
        assert stacks[node].part()["devices"] == {f"{node}/cpu": len(os.sched_getaffinity(0))}


def test_a_one_node_plan_starts_whole_with_its_replicas_pins_and_split(tmp_path):
    stack = make_plan_stack(_write(tmp_path, _one_node(_raw())), None, None, tmp_path / "d")
    stack.plan()
    specs = {s.name: s for s in stack.worker_specs()}
    assert sorted(specs) == ["smollm2.decode0", "smollm2.prefill0", "smollm2.prefill1"]
    assert specs["smollm2.prefill1"].cpus == [1]
    assert specs["smollm2.prefill1"].env["SGLANG_CPU_OMP_THREADS_BIND"] == "1"
    argv = specs["smollm2.prefill1"].argv
    assert argv[argv.index("--max-total-tokens") + 1] == "4096"
    assert specs["smollm2.decode0"].cpus is None
    (router,) = stack.router_specs()
    assert router.argv.count("--prefill") == 2 and router.argv.count("--decode") == 1
    entry = stack.cluster()["models"]["smollm2"]
    assert entry["prefill_shares"] == [0.75, 0.25] and entry["decode_shares"] == [1.0]
    assert len(entry["prefill_urls"]) == 2


def test_parts_merge_in_replica_order_and_a_missing_node_is_named(tmp_path):
    raw = _raw()
    raw["workers"].append({**raw["workers"][0], "replica": 1, "node": "b"})
    raw["workers"][0]["share"] = raw["workers"][2]["share"] = 0.5
    plan = DeploymentPlan.model_validate(raw)
    common = {"model_path": "m", "tokenizer_path": "m", "processes": {}}
    part_b = NodePart(
        node="b",
        host="127.0.0.2",
        backend="torch",
        models={
            "smollm2": {
                **common,
                "prefill_replicas": [1],
                "prefill_urls": ["http://127.0.0.2:11"],
                "bootstrap_ports": [12],
                "decode_replicas": [0],
                "decode_urls": ["http://127.0.0.2:13"],
                "processes": {"http://127.0.0.2:13": {"name": "smollm2.decode0", "pid": 7}},
            }
        },
    )
    part_a = NodePart(
        node="a",
        host="127.0.0.1",
        backend="torch",
        models={
            "smollm2": {
                **common,
                "prefill_replicas": [0],
                "prefill_urls": ["http://127.0.0.1:21"],
                "bootstrap_ports": [22],
            }
        },
    )
    merged = merge_parts(plan, "p", {Path("b"): part_b, Path("a"): part_a})["smollm2"]
    assert merged["prefill_urls"] == ["http://127.0.0.1:21", "http://127.0.0.2:11"]
    assert merged["bootstrap_ports"] == [22, 12]
    # A pid names a process on its own node only: the shell router probes remote workers.
    assert merged["processes"]["http://127.0.0.2:13"] == {"name": "smollm2.decode0"}
    with pytest.raises(LaunchError, match="no part for node.s. a of plan p"):
        merge_parts(plan, "p", {Path("b"): part_b})


def test_a_plan_for_eight_questions_starts_its_decode_workers_with_their_running_requests(
    tmp_path,
):
    """As the planner simulated it (simulation/deployment.py, the plan's concurrency)."""
    raw = _one_node(_raw())
    raw["predicted"]["concurrency"] = 8
    stack = make_plan_stack(_write(tmp_path, raw), None, None, tmp_path / "d")
    stack.plan()
    specs = {s.name: s.argv for s in stack.worker_specs()}
    need = running_needs(stack.configs, 8)["smollm2"]
    decode = specs["smollm2.decode0"]
    assert need > DEFAULT_MAX_RUNNING_REQUESTS
    assert decode[decode.index("--max-running-requests") + 1] == str(need)
    assert "--max-running-requests" not in specs["smollm2.prefill0"]
