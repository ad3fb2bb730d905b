"""`moa-pd plan --profile`: the placement and replication MILP (planning.ilp), its baselines and
the command, on the paper's 9-3-1 hetero tree with the issue's anchor costs (no GPU needed)."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from planning import baselines
from planning.cost_model import critical_path_seconds, device_loads, role_work
from planning.devices import cluster
from planning.ilp import solve
from planning.ilp_plan import PlanRequest, plan_with_ilp, round_estimate
from planning.pack import PlanError, place
from planning.plan_file import DeploymentPlan, Prediction
from planning.types import GPU, MIB, WorkerDemand
from router.config_loader import load_config
from tests.anchor_profile import anchor_profile, model_profile

TREE = "cfgs/tree_9_3_1_dummy_gpu.json"
HEADROOM = 6144


@pytest.fixture(scope="module")
def tree():
    return load_config(TREE)


@pytest.fixture(scope="module")
def profile():
    return anchor_profile()


def work_of(tree, profile, concurrency):
    return role_work([tree], profile, concurrency, 256)


def gpu_use(plan: DeploymentPlan, work) -> dict:
    """MiB each GPU holds under the plan: weights and pool over the TP ranks, plus headroom."""
    used = defaultdict(float)
    for w in plan.workers:
        rw = work[(w.model, w.role)]
        mib = (rw.weights_bytes + w.pool_tokens * rw.kv_bytes_per_token) / w.tp / MIB + HEADROOM
        for g in w.gpus:
            used[(w.node, g)] += mib
    return used


def shares(plan: DeploymentPlan) -> dict:
    out = defaultdict(list)
    for w in plan.workers:
        out[(w.model, w.role)].append(w.share)
    return out


def request(tree, profile, gpus, concurrency, mode="replicate", nodes=1):
    return PlanRequest(
        [tree],
        [TREE],
        profile,
        "anchor.json",
        cluster("gpu", gpus, nodes, None, "H200"),
        concurrency,
        mode,
        256,
        HEADROOM,
    )


def round_s(tree, profile, sol, concurrency) -> float:
    """The planner's estimate of a round under a solution (ilp_plan.round_estimate): the busiest
    device's load, or one question's critical path under its replicas if longer."""
    replicas = [p.replica for p in sol.replicas]
    chain = critical_path_seconds([tree], profile, concurrency, 256, replicas)
    return round_estimate(sol.objective_s, chain, concurrency).latency_median_s


def test_replicates_the_heavy_model_when_throughput_is_the_bottleneck(tree, profile):
    work = work_of(tree, profile, 32)
    c = cluster("gpu", "4x141GiB", 1, None, "H200")
    free = solve(work, c, "replicate", HEADROOM)
    fixed = solve(work, c, "fixed", HEADROOM)
    counts = defaultdict(int)
    for p in free.replicas:
        counts[(p.replica.model, p.replica.role)] += 1
    assert counts[("qwen3-32b", "decode")] >= 2  # the heaviest load is split over replicas
    assert free.objective_s < 0.95 * fixed.objective_s
    assert round_s(tree, profile, free, 32) < 0.9 * round_s(tree, profile, fixed, 32)  # 17% here
    # At concurrency 1 a question's chain bounds everything: replicas buy (almost) nothing.
    work = work_of(tree, profile, 1)
    light, alone = solve(work, c, "replicate", HEADROOM), solve(work, c, "fixed", HEADROOM)
    chain = critical_path_seconds([tree], profile, 1, 256, [p.replica for p in light.replicas])
    assert chain > light.objective_s  # one question's chain, not a device's load
    assert round_s(tree, profile, light, 1) > 0.98 * round_s(tree, profile, alone, 1)  # 1% here


def test_fixed_mode_keeps_one_replica_per_role_and_shares_sum_to_one(tree, profile):
    scored = plan_with_ilp(request(tree, profile, "4x141GiB", 8, "fixed"))
    plan = scored[0].plan
    assert sorted((w.model, w.role) for w in plan.workers) == sorted(work_of(tree, profile, 8))
    assert all(w.share == 1 for w in plan.workers)
    free = plan_with_ilp(request(tree, profile, "4x141GiB", 32))[0].plan
    for split in shares(free).values():
        assert sum(split) == pytest.approx(1.0)
    assert len({(w.model, w.role, w.replica) for w in free.workers}) == len(free.workers)


def test_the_plan_respects_memory_and_its_objective_is_its_load(tree, profile):
    work = work_of(tree, profile, 32)
    c = cluster("gpu", "8x80GiB", 1, None, "H200")
    sol = solve(work, c, "replicate", HEADROOM)
    loads = device_loads([p.replica for p in sol.replicas], work)
    assert max(loads.values()) == pytest.approx(sol.objective_s, rel=1e-6)
    plan = plan_with_ilp(request(tree, profile, "8x80GiB", 32))[0].plan
    assert max(gpu_use(plan, work).values()) <= 80 * 1024
    # A TP worker of the 32B model sits on an aligned block of one node's GPUs, started first.
    for w in plan.workers:
        assert len(w.gpus) == w.tp and w.gpus[0] % w.tp == 0
        assert 0 < w.mem_fraction_static < 1


def test_an_infeasible_request_names_what_does_not_fit(tree, profile):
    work = work_of(tree, profile, 8)
    with pytest.raises(PlanError, match="qwen3-32b.*does not fit"):
        solve(work, cluster("gpu", "2x24GiB", 1, None, "H200"), "replicate", HEADROOM)
    with pytest.raises(PlanError, match=r"no placement fits.*qwen3-32b.*2 GPU\(s\) hold"):
        solve(work, cluster("gpu", "2x80GiB", 1, None, "H200"), "replicate", HEADROOM)


def test_the_9_3_1_tree_on_8_gpus_solves_in_under_10_s(tree, profile):
    work = work_of(tree, profile, 32)
    for gpus, nodes in (("8x141GiB", 1), ("4x141GiB", 2)):  # one node of 8, two of 4
        sol = solve(work, cluster("gpu", gpus, nodes, None, "H200"))
        assert sol.status == "optimal" and sol.seconds < 10
        assert {d[0] for p in sol.replicas for d in p.replica.devices} <= {"node0", "node1"}


def test_naive_and_greedy_baselines_are_plans(tree, profile):
    work = work_of(tree, profile, 8)
    c = cluster("gpu", "8x141GiB", 1, None, "H200")
    naive = baselines.naive(work, c, HEADROOM)
    # Dealt in the config's model order, prefill then decode, one GPU each.
    assert [(p.replica.model, p.replica.role, p.replica.devices) for p in naive] == [
        (m, r, (("node0", 2 * i + j),))
        for i, m in enumerate(("qwen3-4b", "qwen3-8b", "qwen3-32b"))
        for j, r in enumerate(("prefill", "decode"))
    ]
    greedy = baselines.greedy(work, {m: s for m, s in tree.models.items()}, c, HEADROOM, 8)
    gpus = [GPU(i, "H200", 141 * 1024, 141 * 1024) for i in range(8)]
    demands = [
        WorkerDemand(m, r, 0, 1, w.weights_bytes, w.kv_bytes_per_token, w.pool_need)
        for (m, r), w in work.items()
    ]
    packed = place(demands, gpus, "pack", 8, HEADROOM)
    assert sorted((p.replica.model, p.replica.role, p.replica.devices[0][1]) for p in greedy) == (
        sorted((w.demand.model, w.demand.role, w.gpus[0]) for w in packed.workers)
    )
    scored = plan_with_ilp(request(tree, profile, "4x141GiB", 8))
    assert [s.name for s in scored] == ["plan", "naive", "greedy"]
    for s in scored:
        assert s.plan is not None and max(gpu_use(s.plan, work).values()) <= 141 * 1024
        assert all(sum(v) == pytest.approx(1.0) for v in shares(s.plan).values())
    # The MILP is never worse than either baseline under its own objective, nor (here) under the
    # cost model's round estimate, which the plan carries when no simulator scores it.
    assert scored[0].objective_s <= min(s.objective_s for s in scored[1:]) + 1e-6
    best = max(s.prediction.throughput_qps for s in scored[1:])
    assert scored[0].plan.predicted.throughput_qps >= best
    assert set(scored[0].plan.baselines) == {"naive", "greedy"}


def test_a_cpu_plan_puts_workers_on_cores_sharing_ram():
    cfg = load_config("cfgs/tree_9_3_1_cpu.json")
    mp = model_profile((0.5, 2.0), (0.05, 0.08), 270_000_000, 30_000, pd_fixed=0.05)
    prof = anchor_profile().model_copy(update={"models": {"smollm2": mp}})
    req = PlanRequest(
        [cfg],
        ["tree_9_3_1_cpu"],
        prof,
        "p.json",
        cluster("cpu", "2x8GiB", 1, None, "cpu"),
        8,
        "replicate",
        256,
        1024,
    )
    plan = plan_with_ilp(req)[0].plan
    assert all(w.gpus == [] and len(w.cpus) == 1 and w.turn == 0 for w in plan.workers)
    assert {c for w in plan.workers for c in w.cpus} <= {0, 1}


def test_moa_pd_plan_with_a_profile(tree, profile, tmp_path, monkeypatch, capsys):
    from launch.cli import main
    from simulation import predict

    seen = []

    def fake_simulator(plan, configs, prof, concurrency):
        seen.append(plan)
        n = len(plan.workers)  # a stand-in score that tells the plans apart
        return Prediction(
            concurrency=concurrency, latency_median_s=n, latency_p90_s=2 * n, throughput_qps=1 / n
        )

    monkeypatch.setattr(predict, "predict_plan", fake_simulator)
    monkeypatch.setenv("COLUMNS", "200")
    path = tmp_path / "profile.json"
    profile.dump(path)
    out = tmp_path / "plan.json"
    argv = ["plan", "--config", TREE, "--profile", str(path), "--concurrency", "32"]
    assert main([*argv, "--gpus", "4x141GiB", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "qwen3-32b.decode1" in text and "naive" in text and "greedy" in text
    plan = DeploymentPlan.load(out)
    assert len(seen) == 3 and plan.predicted.latency_median_s == len(plan.workers)
    assert set(plan.baselines) == {"naive", "greedy"}
    assert plan.solver["name"].startswith("scipy.optimize.milp") and plan.solver["seconds"] < 10
    assert json.loads(out.read_text())["schema"] == "moa-pd.plan/1"
    assert main([*argv, "--gpus", "2x80GiB"]) == 2
    assert "no placement fits" in capsys.readouterr().err
    assert main([*argv, "--gpus", "0,1"]) == 2
    assert "count of GPUs" in capsys.readouterr().err
