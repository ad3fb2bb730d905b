"""A reference decode worker runs as many requests at once as the configs' agents have in flight at
the deployment's concurrency (planning.pool_need.running_needs): `moa-pd up` raises its
--max-running-requests to that, and the simulator admits the same number."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launch.stack import Stack
from planning.pool_need import running_needs
from profiling.profile_file import Profile
from router.config_loader import load_config
from sglang_ext.server_args import DEFAULT_MAX_RUNNING_REQUESTS
from simulation.deployment import default_deployment

SIMULATION_PROFILE = Path(__file__).parent / "data" / "simulation" / "profile_cpu.json"
CFGS = Path(__file__).parent.parent / "cfgs"


def test_the_need_is_the_widest_layer_of_a_models_agents_times_the_questions_in_flight():
    tree = load_config("tree_9_3_1_cpu")
    assert running_needs([tree], 1) == {"smollm2": 9}
    assert running_needs([tree], 8) == {"smollm2": 72}
    # Two configs on one model: the larger need (9 leaves, or 9 second-layer aggregators).
    dense = load_config("all_to_all_9_9_1_cpu")
    assert running_needs([tree, dense], 4) == {"smollm2": 36}
    # Per model: each counts its own agents only.
    mixed = load_config("tree_9_3_1_mixed_cpu")
    needs = running_needs([mixed], 2)
    for model, need in needs.items():
        mine = [a for a in mixed.agents if a.model == model]
        leaves = [a for a in mine if not mixed.precursors(a.id)]
        assert need == 2 * max(len(leaves), len(mine) - len(leaves)), model


def _decode_argv(tmp_path, config: str, concurrency: int) -> tuple[list[str], list[str]]:
    cfg = load_config(config)
    stack = Stack([cfg], [config], "torch", tmp_path / "run", concurrency=concurrency)
    stack.plan()
    specs = {s.name.rsplit(".", 1)[1]: s.argv for s in stack.worker_specs()}
    return specs["decode0"], specs["prefill0"]


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_up_raises_a_decode_workers_running_requests_to_the_need(tmp_path):
    decode, prefill = _decode_argv(tmp_path, "tree_9_3_1_cpu", 8)
    assert _flag(decode, "--max-running-requests") == "72"
    assert "--max-running-requests" not in prefill  # prefill's batch is bounded by its tokens
    # At concurrency 1 the need (9) is below the engine's default: nothing added.
    decode, _ = _decode_argv(tmp_path, "tree_9_3_1_cpu", 1)
    assert 9 < DEFAULT_MAX_RUNNING_REQUESTS and "--max-running-requests" not in decode


def test_a_configs_own_running_requests_win(tmp_path):
    raw = json.loads((CFGS / "tree_9_3_1_cpu.json").read_text())
    raw["name"] = "capped"
    raw["models"]["smollm2"]["server_args"]["torch"]["max_running_requests"] = 12
    path = tmp_path / "capped.json"
    path.write_text(json.dumps(raw))
    decode, _ = _decode_argv(tmp_path, str(path), 8)
    assert decode.count("--max-running-requests") == 1  # the config's, nothing appended
    assert _flag(decode, "--max-running-requests") == "12"


@pytest.mark.parametrize(("concurrency", "slots"), [(1, 16), (4, 36), (8, 72)])
def test_the_simulator_admits_what_up_would_start(concurrency, slots):
    profile = Profile.load(SIMULATION_PROFILE)
    tree = load_config("tree_9_3_1_cpu")
    dep = default_deployment([tree], profile, concurrency)
    assert dep.decode_slots == {"smollm2": slots}


def test_cluster_json_records_the_concurrency_and_run_warns_when_it_sends_more(tmp_path):
    from experiments.run import undersized_warning
    from router.cluster import ClusterSpec

    cfg = load_config("tree_9_3_1_cpu")
    stack = Stack([cfg], ["tree_9_3_1_cpu"], "torch", tmp_path / "run", concurrency=4)
    stack.plan()
    stack.worker_specs()
    cluster = stack.cluster()
    assert cluster["concurrency"] == 4
    assert ClusterSpec.model_validate(cluster).concurrency == 4
    path = tmp_path / "cluster.json"
    assert undersized_warning(cluster, 4, path) is None
    assert undersized_warning(cluster, 2, path) is None
    warning = undersized_warning(cluster, 8, path)
    assert warning is not None and "moa-pd up --concurrency 8" in warning and str(path) in warning
    # A cluster.json from before the field: nothing to compare, no warning.
    del cluster["concurrency"]
    assert undersized_warning(cluster, 8, path) is None
