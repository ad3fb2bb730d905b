"""`moa-pd plan --profile`: the placement and replication MILP (planning.ilp), the local search
the simulator scores (planning.search), the baselines, the bounds and the command, on the paper's
9-3-1 hetero tree with the issue's anchor costs (no GPU needed)."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from planning import baselines
from planning.cost_model import critical_path_seconds, device_loads, role_work
from planning.devices import cluster, device_key, parse_device_key
from planning.ilp import PlacedReplica, solve
from planning.ilp_plan import PlanRequest, plan_with_ilp
from planning.pack import PlanError, place
from planning.plan_file import DeploymentPlan, Prediction
from planning.search import WINDOW, moves, rebalance, refine, signature, simulated_loads
from planning.types import GPU, MIB, WorkerDemand
from router.config_loader import load_config
from simulation.predict import predict_plan
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


def request(tree, profile, gpus, concurrency, mode="replicate", nodes=1, search_s=0.0):
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
        search_s=search_s,
    )


def by_workers(plan, configs, profile, concurrency, *, setting=3, questions=None, **_):
    """A stand-in for the simulator that tells plans apart: fewer workers, faster."""
    n = len(plan.workers) + (setting == 7)
    return Prediction(
        concurrency=concurrency, latency_median_s=n, latency_p90_s=2 * n, throughput_qps=1 / n
    )


def round_s(tree, profile, sol, concurrency) -> float:
    """The MILP's view of a round under a solution: the busiest device's load, or one question's
    critical path under its replicas if longer."""
    replicas = [p.replica for p in sol.replicas]
    chain = critical_path_seconds([tree], profile, concurrency, 256, replicas)
    return max(sol.objective_s, chain)


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
    plan = plan_with_ilp(
        request(tree, profile, "4x141GiB", 8, "fixed", search_s=5), by_workers
    ).plan
    assert sorted((w.model, w.role) for w in plan.workers) == sorted(work_of(tree, profile, 8))
    assert all(w.share == 1 for w in plan.workers)
    free = plan_with_ilp(request(tree, profile, "4x141GiB", 32), by_workers).plan
    for split in shares(free).values():
        assert sum(split) == pytest.approx(1.0)
    assert len({(w.model, w.role, w.replica) for w in free.workers}) == len(free.workers)


def test_the_plan_respects_memory_and_its_objective_is_its_load(tree, profile):
    work = work_of(tree, profile, 32)
    c = cluster("gpu", "8x80GiB", 1, None, "H200")
    sol = solve(work, c, "replicate", HEADROOM)
    loads = device_loads([p.replica for p in sol.replicas], work)
    assert max(loads.values()) == pytest.approx(sol.objective_s, rel=1e-6)
    plan = plan_with_ilp(request(tree, profile, "8x80GiB", 32), by_workers).plan
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
    # The paper's layout: every worker alone on GPUs of its own, as many as that takes.
    paper, own = baselines.paper(work, c, HEADROOM)
    assert own.per_node == 6 and sorted(p.replica.devices[0][1] for p in paper) == list(range(6))


def test_the_plan_beats_the_milp_and_the_baselines_in_the_simulator_within_its_bounds(
    tree, profile
):
    report = plan_with_ilp(request(tree, profile, "4x141GiB", 8, search_s=3), predict_plan)
    names = [s.name for s in report.scored]
    assert names == ["plan", "ilp", "naive", "greedy", "paper", "naive_layer_barrier"]
    work = work_of(tree, profile, 8)
    for s in report.scored:
        assert s.plan is not None and all(
            sum(v) == pytest.approx(1.0) for v in shares(s.plan).values()
        )
        if s.name != "paper":  # the paper's layout takes 6 GPUs
            assert max(gpu_use(s.plan, work).values()) <= 141 * 1024 and s.devices == 4
    qps = {s.name: s.prediction.throughput_qps for s in report.scored}
    assert qps["plan"] >= max(qps["ilp"], qps["naive"], qps["greedy"])
    assert qps["naive_layer_barrier"] < qps["naive"]  # a barrier per layer hides nothing
    b = report.bounds
    assert b.little_qps == pytest.approx(8 / b.alone_s)
    assert b.capacity_qps == pytest.approx(4 / b.device_seconds_per_question)
    # One question alone is no slower on a plan than its share of a loaded one, so Little's law
    # bounds every plan (closed loop: throughput = Q / mean latency, up to ramp-up and drain).
    assert all(q <= 1.02 * b.little_qps for q in qps.values())
    assert report.plan.baselines.keys() == set(names) - {"plan"}
    assert report.plan.bounds == {"little_qps": b.little_qps, "capacity_qps": b.capacity_qps}
    assert report.plan.solver["chosen_from"] in ("searched", "ilp", "naive", "greedy")
    assert report.solve_s < 10


def rebalance_all(placed, work):
    for key in work:
        placed = rebalance(placed, key, work)
    return placed


def test_the_search_takes_moves_that_the_score_rewards_until_none_does(tree, profile):
    """With the cost model's busiest device as the score, the search spreads a plan that puts
    every worker on one of four GPUs (big enough to hold them all), and stops where no move
    helps."""
    work = work_of(tree, profile, 8)
    c = cluster("gpu", "4x1000GiB", 1, None, "H200")
    start = [
        PlacedReplica(
            p.replica.__class__(p.replica.model, p.replica.role, (("node0", 0),), 1.0),
            p.pool_tokens,
        )
        for p in baselines.naive(work, c, HEADROOM)
    ]

    def score(placed):
        busiest = max(device_loads([p.replica for p in placed], work).values())
        return Prediction(
            concurrency=8,
            latency_median_s=busiest,
            latency_p90_s=busiest,
            throughput_qps=8 / busiest,
        )

    tps = {k: [1] for k in work}
    result = refine(start, score(start), score, work, c, tps, "replicate", HEADROOM, 60)
    assert result.converged and result.accepted and result.evaluations >= len(result.accepted)
    # Under the MILP's own objective, it ends near the MILP's optimum (it has the same moves).
    optimum = solve(work, c, "replicate", HEADROOM).objective_s
    assert result.prediction.latency_median_s <= 1.1 * optimum
    assert score(start).latency_median_s > 1.5 * optimum
    assert {d for p in result.placed for d in p.replica.devices} == set(c.devices)
    # No move of the end plan scores better by the search's margin.
    again = refine(result.placed, result.prediction, score, work, c, tps, "replicate", HEADROOM, 60)
    assert again.accepted == []
    fixed = refine(start, score(start), score, work, c, tps, "fixed", HEADROOM, 60)
    assert len(fixed.placed) == len(start)  # fixed mode only moves workers

    # Where replicas buy nothing, the search sheds them: as fast with fewer workers.
    doubled = rebalance_all(
        [
            *start,
            *(
                PlacedReplica(
                    p.replica.__class__(p.replica.model, p.replica.role, (("node0", 1),), 1.0),
                    p.pool_tokens,
                )
                for p in start
            ),
        ],
        work,
    )
    flat = Prediction(concurrency=8, latency_median_s=1, latency_p90_s=1, throughput_qps=1)
    shed = refine(doubled, flat, lambda placed: flat, work, c, tps, "replicate", HEADROOM, 60)
    assert len(shed.placed) == len(work) and all(a.startswith("remove") for a in shed.accepted)


def test_the_simulated_utilization_orders_the_moves_and_the_best_of_a_window_is_taken(
    tree, profile
):
    """The simulator's device utilization, not the cost model's round, says which device to
    relieve and where to: with GPU 3 idle, the first move that is not a removal takes work off
    the busiest GPU onto it. Of the improving moves, the best of the first WINDOW is taken."""
    assert simulated_loads(
        {"node0:gpu0,1": 0.5, "node0:gpu3": 0.25, "node1:cpu": 0.75},
        cluster("cpu", "2x16GiB", 2, None, "cpu"),
    ) == {
        ("node0", 0): 0.5,
        ("node0", 1): 0.5,
        ("node0", 3): 0.25,
        ("node1", 0): 0.75,
        ("node1", 1): 0.75,
    }
    work = work_of(tree, profile, 8)
    c = cluster("gpu", "4x1000GiB", 1, None, "H200")
    placed = [
        PlacedReplica(
            p.replica.__class__(p.replica.model, p.replica.role, (("node0", i % 3),), 1.0),
            p.pool_tokens,
        )
        for i, p in enumerate(baselines.naive(work, c, HEADROOM))
    ]
    busy = {"node0:gpu0": 0.2, "node0:gpu1": 0.9, "node0:gpu2": 0.4}
    tps = {k: [1] for k in work}
    ordered = list(moves(placed, work, c, tps, "replicate", HEADROOM, busy))
    first = next(m for m in ordered if not m.what.startswith("remove"))
    assert "node0:1" in first.what and first.what.endswith("node0:3")
    # Without a simulation the cost model orders them (another order here).
    assert [m.what for m in moves(placed, work, c, tps, "replicate", HEADROOM)] != [
        m.what for m in ordered
    ]

    # A score that rewards every move but a removal a little, the second in order the most: the
    # search takes the best of the first WINDOW improving moves, not the first.
    kept = [m for m in ordered if not m.what.startswith("remove")]
    gain = {signature(m.placed): 1.10 for m in kept} | {signature(kept[1].placed): 1.20}

    def score(cand):
        q = gain.get(signature(cand), 0.5) if signature(cand) != signature(placed) else 1.0
        return Prediction(
            concurrency=8,
            latency_median_s=8 / q,
            latency_p90_s=8 / q,
            throughput_qps=q,
            device_utilization=busy,
        )

    result = refine(placed, score(placed), score, work, c, tps, "replicate", HEADROOM, 60)
    assert WINDOW > 1 and result.accepted[0] == kept[1].what


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
    plan = plan_with_ilp(req, by_workers).plan
    assert all(w.gpus == [] and len(w.cpus) == 1 and w.turn == 0 for w in plan.workers)
    assert {c for w in plan.workers for c in w.cpus} <= {0, 1}


def test_moa_pd_plan_with_a_profile(tree, profile, tmp_path, monkeypatch, capsys):
    from launch.cli import main
    from simulation import predict

    seen = []

    def fake_simulator(plan, *args, **kwargs):
        seen.append(plan)
        return by_workers(plan, *args, **kwargs)

    monkeypatch.setattr(predict, "predict_plan", fake_simulator)
    monkeypatch.setenv("COLUMNS", "200")
    path = tmp_path / "profile.json"
    profile.dump(path)
    out = tmp_path / "plan.json"
    argv = ["plan", "--config", TREE, "--profile", str(path), "--concurrency", "32"]
    assert main([*argv, "--gpus", "4x141GiB", "--out", str(out), "--search-seconds", "0"]) == 0
    text = capsys.readouterr().out
    for name in ("ilp", "naive", "greedy", "paper", "naive_layer_barrier", "÷ Little", "capacity"):
        assert name in text
    plan = DeploymentPlan.load(out)
    assert plan.predicted.latency_median_s == len(plan.workers) == 6  # the fewest workers won
    assert set(plan.baselines) == {"ilp", "naive", "greedy", "paper", "naive_layer_barrier"}
    assert plan.solver["name"].startswith("scipy.optimize.milp") and plan.solver["seconds"] < 10
    assert plan.solver["search_evaluations"] == 0  # no budget: the best proposal
    assert json.loads(out.read_text())["schema"] == "moa-pd.plan/1"

    seen.clear()
    assert main([*argv, "--gpus", "4x141GiB", "--json", "--search-seconds", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)  # nothing but the JSON on stdout
    assert doc["chosen"] == "plan" and doc["concurrency"] == 32
    assert set(doc["plans"]) == {"plan", "ilp", "naive", "greedy", "paper", "naive_layer_barrier"}
    for entry in doc["plans"].values():
        assert {"throughput_qps", "latency_median_s", "latency_p90_s", "workers"} <= set(entry)
        assert entry["of_little"] == pytest.approx(
            entry["throughput_qps"] / doc["bounds"]["little_qps"]
        )
    assert (
        doc["plans"]["paper"]["devices"] == 6
        and doc["plans"]["naive_layer_barrier"]["setting"] == 7
    )
    assert set(doc["bounds"]) >= {"little_qps", "capacity_qps"} and doc["solve_s"] < 10
    # 3 proposals, 5 plans reported (and the searched one where it moved: under this stand-in
    # every move taken removes a worker, so it moved where one was taken), 2 of one question alone
    reported = 5 + bool(doc["search"]["accepted"])
    assert doc["search"]["evaluations"] == len(seen) - 3 - reported - 2
    assert main([*argv, "--gpus", "2x80GiB"]) == 2
    assert "no placement fits" in capsys.readouterr().err
    assert main([*argv, "--gpus", "0,1"]) == 2
    assert "count of GPUs" in capsys.readouterr().err
    assert main([*argv, "--gpus", "4x141GiB", "--search-seconds", "-1"]) == 2
    assert "--search-seconds must be >= 0" in capsys.readouterr().err


def test_a_device_key_round_trips_and_a_bad_one_is_named():
    """One name for what a worker runs on, made by the simulator's deployment and read back by
    the planner's search (its loads) and the simulator (a TP group's GPUs)."""
    for node, kind, ids in (("n0", "gpu", [3]), ("n0", "gpu", [0, 1]), ("n1", "cpu", [2, 3])):
        assert parse_device_key(device_key(node, kind, ids)) == (node, kind, ids)
    assert device_key("n1", "cpu") == "n1:cpu" and parse_device_key("n1:cpu") == ("n1", "cpu", [])
    assert parse_device_key("gpu2") == ("", "gpu", [2])
    with pytest.raises(ValueError, match="'n0:tpu1' is no device key"):
        parse_device_key("n0:tpu1")
