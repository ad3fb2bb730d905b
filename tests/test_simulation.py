"""The simulator (simulation/) against hand-computed times on a hand-made profile whose costs are
exact lines: blocking vs pipelined on a two-leaf tree, continuous batching, shared cores."""

from __future__ import annotations

import pytest
import simpy

from profiling.profile_file import DecodePoint, DeviceInfo, ModelProfile, PrefillPoint, Profile
from router.config import TopologyConfig
from simulation.deployment import SimDeployment, SimWorker, default_deployment
from simulation.device import Device
from simulation.engine import Simulation
from simulation.predict import predict_plan
from simulation.router_load import RouterCosts
from simulation.workers import DecodeWorker
from simulation.workload import from_config

# prefill: A + B·new (no context term); decode step: DA + DB·batch; PD hop: PD.
A, B, DA, DB, PD = 0.1, 0.01, 0.05, 0.01, 0.2


def model_profile() -> ModelProfile:
    pre = [PrefillPoint(new_tokens=n, cached_tokens=0, seconds=A + B * n) for n in (16, 256, 1024)]
    dec = [
        DecodePoint(batch=b, context=c, step_seconds=DA + DB * b) for b in (1, 8) for c in (64, 512)
    ]
    return ModelProfile(
        model_path="m",
        weights_bytes=1,
        kv_bytes_per_token=1,
        prefill=pre,
        decode=dec,
        pd_fixed_seconds=PD,
    )


def profile(kind: str = "cuda", cores: int | None = None) -> Profile:
    return Profile(
        device=DeviceInfo(kind=kind, name="test", count=1, cores=cores),
        backend="torch",
        versions={},
        created="2026-01-01T00:00:00Z",
        models={"m": model_profile()},
    )


def tree(min_chunk: int = 4096) -> TopologyConfig:
    return TopologyConfig.model_validate(
        {
            "name": "two_leaf",
            "models": {"m": {"model_path": "smollm2-135m"}},
            "templates": {
                "l0": {"user": "{question}"},
                "l1": {"system": "Another view.", "user": "{question}"},
                "agg": {"user": "Q: {question}\nA1: <|answer:a|>\nA2: <|answer:b|>\nBest answer:"},
            },
            "agents": [
                {"id": "a", "model": "m", "template": "l0", "sampling": {"max_new_tokens": 10}},
                {"id": "b", "model": "m", "template": "l1", "sampling": {"max_new_tokens": 20}},
                {"id": "s", "model": "m", "template": "agg", "sampling": {"max_new_tokens": 5}},
            ],
            "incremental_prefill": {"min_chunk_tokens": min_chunk},
        }
    )


def run_one(cfg: TopologyConfig, mode: str):
    sim = Simulation([cfg], profile(), default_deployment([cfg], profile()))
    out = sim.run([(from_config(cfg), 2 if mode != "pipelined" else 3, mode, False)])
    return out.rows[0]


def test_blocking_and_pipelined_match_hand_computed_times():
    cfg = tree()
    w = from_config(cfg).agents
    step = lambda batch: DA + DB * batch
    # Both leaves' prompts in one prefill forward, then the PD hop: their first tokens.
    t1 = A + B * (sum(w["a"].pieces) + sum(w["b"].pieces)) + PD
    # a's 9 remaining tokens beside b, then b's last 10 alone.
    end_b = t1 + 9 * step(2) + 10 * step(1)
    prompt = sum(w["s"].pieces) + 10 + 20
    blocking_e2e = end_b + A + B * prompt + PD + 4 * step(1)

    row = run_one(cfg, "blocking")
    assert row.agents["a"].end_s == pytest.approx(t1 + 9 * step(2))
    assert row.agents["b"].end_s == pytest.approx(end_b)
    assert row.e2e_s == pytest.approx(blocking_e2e)

    # Pipelined with warm-ups held to the first one (min_chunk_tokens larger than any growth):
    # it goes out when the leaves' prefill holds end (their first tokens), carrying the static
    # head and a's first token; the final request computes everything else.
    piped = run_one(cfg, "pipelined")
    assert piped.agents["s"].warmups == 1
    warmed = w["s"].pieces[0] + 1
    assert piped.agents["s"].cached_tokens == warmed
    assert piped.e2e_s == pytest.approx(blocking_e2e - B * warmed)

    # Small chunks: warm-ups follow the leaves' tokens, and only the last bits stay exposed.
    eager = run_one(tree(min_chunk=2), "pipelined")
    assert eager.agents["s"].cached_tokens > w["s"].pieces[0] + 10
    assert eager.e2e_s < piped.e2e_s


def test_continuous_batching_makes_decode_sublinear():
    env = simpy.Environment()
    dec = DecodeWorker(env, "m.decode0", model_profile(), Device(env, "gpu0", 1))
    seqs = [dec.start(100, 10, lambda: None) for _ in range(4)]
    env.run(until=simpy.AllOf(env, [s.done for s in seqs]))
    assert env.now == pytest.approx(10 * (DA + DB * 4))
    assert env.now < 4 * 10 * (DA + DB * 1) / 2  # far below four sequences one after another


@pytest.mark.parametrize("cores, expected", [(1, 2.0), (2, 1.0)])
def test_workers_sharing_cores_slow_down_proportionally(cores, expected):
    env = simpy.Environment()
    dev = Device(env, "cpu", cores)
    done = [env.process(dev.compute(w, 1.0)) for w in ("p", "d")]
    env.run(until=simpy.AllOf(env, done))
    assert env.now == pytest.approx(expected)


def test_two_decode_workers_on_one_core_take_twice_as_long():
    cfg = tree()

    def e2e(devices: dict[str, int], placement: dict[str, str]) -> float:
        workers = tuple(SimWorker("m", r, 0, placement[r]) for r in ("prefill", "decode"))
        dep = SimDeployment(workers, devices, "device", {"m": (4096, 2048)}, "test")
        # No shell-router CPU here: the two workers alone on the cores.
        sim = Simulation([cfg], profile("cpu", 1), dep, router_costs=RouterCosts())
        return sim.run([(from_config(cfg), 2, "blocking", False)]).rows[0].e2e_s

    alone = e2e({"c0": 1, "c1": 1}, {"prefill": "c0", "decode": "c1"})
    shared = e2e({"c0": 1}, {"prefill": "c0", "decode": "c0"})
    # In the blocking chain prefill and decode never overlap: sharing one core costs nothing...
    assert shared == pytest.approx(alone)
    # ...but two questions at once do overlap them, and then the shared core is the bottleneck.
    sim_cfg = [(from_config(cfg, f"q{i}"), 3, "pipelined", False) for i in range(2)]
    dep_shared = SimDeployment(
        tuple(SimWorker("m", r, 0, "c0") for r in ("prefill", "decode")),
        {"c0": 1},
        "device",
        {"m": (4096, 2048)},
        "test",
    )
    dep_apart = SimDeployment(
        (SimWorker("m", "prefill", 0, "c0"), SimWorker("m", "decode", 0, "c1")),
        {"c0": 1, "c1": 1},
        "device",
        {"m": (4096, 2048)},
        "test",
    )
    quiet = RouterCosts()
    slow = Simulation([cfg], profile("cpu", 1), dep_shared, router_costs=quiet).run(sim_cfg, 2)
    fast = Simulation([cfg], profile("cpu", 1), dep_apart, router_costs=quiet).run(sim_cfg, 2)
    assert slow.makespan_s > fast.makespan_s


def test_predict_plan_default_deployment_and_errors():
    cfg = tree()
    pred = predict_plan(None, [cfg], profile(), concurrency=2, setting=2, questions=4)
    assert pred.concurrency == 2
    assert 0 < pred.latency_median_s <= pred.latency_p90_s
    assert pred.throughput_qps > 0
    with pytest.raises(ValueError, match="dense-config"):
        predict_plan(None, [cfg], profile(), concurrency=1, setting=1)


def test_early_exit_cuts_the_slowest_precursor_once_min_completed_completed():
    cfg = TopologyConfig.model_validate(
        {
            "name": "three_leaf",
            "models": {"m": {"model_path": "smollm2-135m"}},
            "templates": {
                "l": {"user": "{question}"},
                "agg": {"user": "{question} <|answer:a|> <|answer:b|> <|answer:c|>"},
            },
            "agents": [
                {"id": i, "model": "m", "template": "l", "sampling": {"max_new_tokens": n}}
                for i, n in (("a", 10), ("b", 20), ("c", 200))
            ]
            + [{"id": "s", "model": "m", "template": "agg", "sampling": {"max_new_tokens": 5}}],
            "early_exit": {"enabled": True, "min_completed": 2},
        }
    )
    dep = default_deployment([cfg], profile())
    q = from_config(cfg)
    full = Simulation([cfg], profile(), dep).run([(q, 3, "pipelined", False)]).rows[0]
    cut = Simulation([cfg], profile(), dep, exit_rate=1.0).run([(q, 4, "pipelined", True)]).rows[0]
    assert cut.agents["c"].killed and cut.agents["s"].slot_order == ["a", "b"]
    # c is cut when b completes; s then needs only a and b.
    assert cut.agents["c"].end_s == pytest.approx(cut.agents["b"].end_s)
    assert cut.e2e_s < full.e2e_s - 100 * DA
