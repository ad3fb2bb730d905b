"""The simulator (simulation/) against hand-computed times on a hand-made profile whose costs are
exact lines: blocking vs pipelined on a two-leaf tree, continuous batching, shared cores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import simpy

from profiling.profile_file import (
    DecodePoint,
    DeviceInfo,
    ModelProfile,
    PDPoint,
    PrefillPoint,
    Profile,
)
from router.config import TopologyConfig
from simulation.deployment import (
    SimDeployment,
    SimWorker,
    default_deployment,
    is_gpu,
    tp_members,
)
from simulation.device import Device, TPGroup
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


def tree(min_chunk: int = 4096, timed: bool = False) -> TopologyConfig:
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
            "incremental_prefill": {"min_chunk_tokens": min_chunk, "warm_before_cap": timed},
        }
    )


# The hand-computed tests' question: short enough that the first warm-up (the aggregator's head)
# ends before the leaves do.
QUESTION_TOKENS = 64


def run_one(cfg: TopologyConfig, mode: str):
    sim = Simulation([cfg], profile(), default_deployment([cfg], profile()))
    q = from_config(cfg, question_tokens=QUESTION_TOKENS)
    out = sim.run([(q, 2 if mode != "pipelined" else 3, mode, False)])
    return out.rows[0]


def blocking_by_hand(cfg: TopologyConfig, n: int = 1) -> tuple[float, float, float]:
    """a's end, b's end and the e2e of `n` copies of tree()'s question started together,
    blocking, on the default deployment of the GPU profile (no shell-router cost): every
    forward holds all n copies."""
    w = from_config(cfg, question_tokens=QUESTION_TOKENS).agents
    step = lambda batch: DA + DB * batch
    # All leaves' prompts in one prefill forward, then the PD hop: their first tokens.
    t1 = A + B * n * (sum(w["a"].pieces) + sum(w["b"].pieces)) + PD
    # a's 9 remaining tokens beside b, then b's last 10 alone.
    end_a = t1 + 9 * step(2 * n)
    end_b = end_a + 10 * step(n)
    prompt = sum(w["s"].pieces) + 10 + 20
    return end_a, end_b, end_b + A + B * n * prompt + PD + 4 * step(n)


def test_blocking_and_pipelined_match_hand_computed_times():
    cfg = tree()
    w = from_config(cfg, question_tokens=QUESTION_TOKENS).agents
    end_a, end_b, blocking_e2e = blocking_by_hand(cfg)

    row = run_one(cfg, "blocking")
    assert row.agents["a"].end_s == pytest.approx(end_a)
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

    # Timed to b's cap (20): once a ended, b is the last open precursor, and one more warm-up
    # goes within one warm-up's time (its rate × the first warm-up's seconds, ~4 tokens) of
    # its cap, as the router's does; the final request leaves that warm-up in flight.
    timed = run_one(tree(timed=True), "pipelined")
    assert timed.agents["s"].warmups == 2
    assert timed.agents["s"].cached_tokens > w["s"].pieces[0] + 10 + 10
    assert timed.e2e_s < piped.e2e_s


def test_continuous_batching_makes_decode_sublinear():
    env = simpy.Environment()
    dec = DecodeWorker(env, "m.decode0", model_profile(), Device(env, "gpu0", 1))
    seqs = [dec.start(100, 10) for _ in range(4)]
    env.run(until=simpy.AllOf(env, [s.done for s in seqs]))
    assert env.now == pytest.approx(10 * (DA + DB * 4))
    assert env.now < 4 * 10 * (DA + DB * 1) / 2  # far below four sequences one after another


def test_decode_counts_tokens_by_steps_calls_back_at_a_count_and_cancels():
    env = simpy.Environment()
    dec = DecodeWorker(env, "m.decode0", model_profile(), Device(env, "gpu0", 1))
    one, two = DA + DB, DA + 2 * DB  # a step of one sequence, of two
    a = dec.start(100, 10)
    seen = []
    dec.when_decoded(a, 3, lambda: seen.append((dec.decoded(a), env.now)))  # before it joined
    dec.when_decoded(a, 11, lambda: seen.append("never: a decodes 10"))
    env.run(until=a.done)
    assert seen == [(3, pytest.approx(3 * one))] and dec.decoded(a) == 10
    assert env.now == pytest.approx(10 * one)

    start = env.now
    b, c = dec.start(100, 10), dec.start(100, 10)
    dec.when_decoded(c, 5, lambda: seen.append("never: c is cut at 2"))

    def cut():
        yield env.timeout(2.5 * two)  # in the third step: it still costs a step of two
        dec.cancel(c)

    env.process(cut())
    env.run(until=b.done)
    assert dec.decoded(c) == 2 and c.done.triggered and len(seen) == 1
    assert env.now - start == pytest.approx(3 * two + 7 * one)


@pytest.mark.parametrize("cores, expected", [(1, 2.0), (2, 1.0)])
def test_workers_sharing_cores_slow_down_proportionally(cores, expected):
    env = simpy.Environment()
    dev = Device(env, "cpu", cores)
    done = [env.process(dev.compute(w, 1.0)) for w in ("p", "d")]
    env.run(until=simpy.AllOf(env, done))
    assert env.now == pytest.approx(expected)


def test_prefill_and_decode_sharing_one_core_cost_time_only_where_they_overlap():
    # Warm-ups every 2 tokens, gated per worker (as on GPUs): with the CPU default, per device,
    # the gate withholds them while the shared core decodes, and the two workers never compute
    # at once.
    cfg = tree(min_chunk=2)

    def run(placement: dict[str, str], mode: str, questions: int):
        workers = tuple(SimWorker("m", r, 0, placement[r]) for r in ("prefill", "decode"))
        cores = {d: 1 for d in placement.values()}
        dep = SimDeployment(workers, cores, "worker", {"m": (4096, 2048)}, "test")
        # No shell-router CPU here: the two workers alone on the cores.
        sim = Simulation([cfg], profile("cpu", 1), dep, router_costs=RouterCosts())
        work = [(from_config(cfg, f"q{i}"), 3, mode, False) for i in range(questions)]
        return sim.run(work, questions)

    apart = {"prefill": "n:cpu0", "decode": "n:cpu1"}
    shared = {"prefill": "n:cpu0", "decode": "n:cpu0"}
    # In the blocking chain prefill and decode never overlap: sharing one core costs nothing...
    alone_e2e = run(apart, "blocking", 1).rows[0].e2e_s
    assert run(shared, "blocking", 1).rows[0].e2e_s == pytest.approx(alone_e2e)
    # ...but two pipelined questions at once do overlap them (warm-ups while leaves decode).
    slow, fast = run(shared, "pipelined", 2), run(apart, "pipelined", 2)
    work = slow.device_busy["n:cpu0"]  # worker-seconds at full speed
    # The same forwards either way: only where they run differs.
    assert [r.agents["s"].warmups for r in slow.rows] == [r.agents["s"].warmups for r in fast.rows]
    assert work == pytest.approx(fast.device_busy["n:cpu0"] + fast.device_busy["n:cpu1"])
    # Apart, the two cores computed at once (the makespan is below the work). Shared, one core
    # does at most one second of work per second however many workers share it, and idles only
    # while both questions (in step) wait on a PD hop: their leaves' and their successors'.
    # A core that ran each sharer at full speed would finish below `work`.
    assert fast.makespan_s < work <= slow.makespan_s <= work + 2 * PD


def test_predict_plan_default_deployment_and_errors():
    cfg = tree()
    # Setting 2 (tree, blocking), one question at a time: each runs alone, as by hand.
    e2e = blocking_by_hand(cfg)[2]
    alone = predict_plan(
        None, [cfg], profile(), 1, setting=2, questions=4, question_tokens=QUESTION_TOKENS
    )
    assert alone.latency_median_s == pytest.approx(e2e)
    assert alone.latency_p90_s == pytest.approx(e2e)
    assert alone.throughput_qps == pytest.approx(1 / e2e)
    # Two at a time: the two identical questions share every forward, in two waves; each takes
    # longer (bigger batches), but more are answered per second (a step costs DA + DB·batch).
    pair_e2e = blocking_by_hand(cfg, n=2)[2]
    pred = predict_plan(
        None, [cfg], profile(), 2, setting=2, questions=4, question_tokens=QUESTION_TOKENS
    )
    assert pred.concurrency == 2
    assert pred.latency_median_s == pytest.approx(pair_e2e)
    assert pred.latency_p90_s == pytest.approx(pair_e2e)
    assert pred.throughput_qps == pytest.approx(2 / pair_e2e)
    assert e2e < pair_e2e < 2 * e2e
    # Each device's utilization comes with it (the planner's search orders its moves by it).
    assert pred.device_utilization and all(0 < u <= 1 for u in pred.device_utilization.values())
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


@pytest.mark.parametrize("mode", ["pipelined", "blocking"])
@pytest.mark.parametrize("n", [2, 3])
def test_replicas_are_chosen_by_load_and_no_agent_is_pinned(n, mode):
    """n prefill and n decode replicas of the model, one GPU each, 100 identical questions one
    at a time. The round robin in agent order this replaced gave each of the three agents the
    same replica in every question when n = 3; the shared rule (router/request_split.py) gives
    the second leaf the replica the first is not busy on, and every agent every replica."""
    cfg = tree(min_chunk=2)
    workers = [
        SimWorker("m", role, r, f"gpu{i * n + r}", 1 / n)
        for i, role in enumerate(("prefill", "decode"))
        for r in range(n)
    ]
    dep = SimDeployment(
        tuple(workers), {w.device: 1 for w in workers}, "worker", {"m": (4096, 2048)}, "test"
    )
    work = [(from_config(cfg, f"q{i}"), 3, mode, False) for i in range(100)]
    out = Simulation([cfg], profile(), dep).run(work, concurrency=1)
    for role in ("prefill", "decode"):
        every = {f"m.{role}{r}" for r in range(n)}
        for agent in ("a", "b", "s"):
            assert {getattr(r.agents[agent], f"{role}_worker") for r in out.rows} == every
        # Both leaves start at once: the second goes where the first is not.
        for r in out.rows:
            assert getattr(r.agents["a"], f"{role}_worker") != getattr(
                r.agents["b"], f"{role}_worker"
            )
    # The decode replicas computed alike (identical questions, spread evenly).
    busy = [out.device_busy[f"gpu{n + r}"] for r in range(n)]
    assert max(busy) / min(busy) < 1.2, busy
    # The same seed, the same choices.
    again = Simulation([cfg], profile(), dep).run(work, concurrency=1)
    assert [r.agents["s"].decode_worker for r in again.rows] == [
        r.agents["s"].decode_worker for r in out.rows
    ]


def test_co_run_fit_recovers_the_device_model_and_the_simulator_applies_it():
    from profiling.co_run import fit

    cores, beta, gamma = 4, 0.1, 0.3
    model = {
        k: min(1, cores / k)
        / (1 + beta * (min(k, cores) - 1))
        / (1 + gamma * max(0, k - cores) / cores)
        for k in range(1, 2 * cores + 1)
    }
    assert fit(cores, model) == (pytest.approx(beta), pytest.approx(gamma))
    assert fit(2, {1: 1.0, 2: 1.05, 3: 0.7, 4: 0.55}) == (0.0, 0.0)  # better than ideal: none

    env = simpy.Environment()
    dev = Device(env, "cpu", 2, co_run_slowdown=0.1, oversubscribed_slowdown=0.2)
    done = [env.process(dev.compute(w, 1.0)) for w in "abcd"]
    env.run(until=simpy.AllOf(env, done))
    assert env.now == pytest.approx(1 / (0.5 / (1.1 * 1.2)))

    cpu = profile("cpu", cores=2)
    cpu = cpu.model_copy(
        update={
            "device": cpu.device.model_copy(
                update={"co_run_slowdown": 0.25, "oversubscribed_slowdown": 0.5}
            )
        }
    )
    sim = Simulation([tree()], cpu, default_deployment([tree()], cpu))
    (device,) = sim.devices.values()
    assert (device.co_run_slowdown, device.oversubscribed_slowdown) == (0.25, 0.5)
    plain = Simulation(
        [tree()], profile("cpu", cores=2), default_deployment([tree()], profile("cpu", cores=2))
    )
    assert next(iter(plain.devices.values())).co_run_slowdown == 0.0


def test_the_co_run_micro_benchmark_runs_processes_side_by_side():
    from profiling.co_run import measure

    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(mine)})  # the processes it starts inherit one core
    try:
        # The median of three rounds: a test file beside it (xdist) may share that core for part
        # of one round.
        co = measure(seconds=0.3, rounds=3)
    finally:
        os.sched_setaffinity(0, mine)
    assert co.cores == 1 and co.rates[1] == 1.0
    assert 0.3 < co.rates[2] < 0.7  # two processes on one core: about half as fast each


def test_workflow_priority_serves_the_oldest_question_first_at_the_decode_slots():
    """Three questions at once, one decode worker with 2 slots (each question has 2 leaves and
    an aggregator). Under FCFS a freed slot goes to whoever asked first, so the first question's
    aggregator waits behind the later questions' leaves; under workflow priority it goes to the
    oldest question (the decode worker's prealloc queue sorted by priority), which ends first,
    and the questions end in the order they started."""
    import dataclasses

    cfg = tree()
    dep = dataclasses.replace(default_deployment([cfg], profile()), decode_slots={"m": 2})
    ends = {}
    for workflow in (False, True):
        work = [(from_config(cfg, f"q{i}"), 2, "blocking", False) for i in range(3)]
        sim = Simulation(
            [cfg], profile(), dep, priority_scheduling=True, workflow_priority=workflow
        )
        ends[workflow] = {r.sample_id: r.e2e_s for r in sim.run(work, concurrency=3).rows}
    fcfs, wf = ends[False], ends[True]
    assert wf["q0"] < fcfs["q0"] - 5 * DA  # its aggregator no longer waits for newer leaves
    assert wf["q0"] < wf["q1"] < wf["q2"]
    assert sum(wf.values()) < sum(fcfs.values())
    # FCFS is the default, and what Simulation did before the switch.
    default = Simulation([cfg], profile(), dep, priority_scheduling=True).run(
        [(from_config(cfg, f"q{i}"), 2, "blocking", False) for i in range(3)], concurrency=3
    )
    assert {r.sample_id: r.e2e_s for r in default.rows} == fcfs


def test_simulate_command_takes_workflow_priority(capsys, tmp_path):
    import argparse
    import json

    from simulation import command

    p = argparse.ArgumentParser()
    command.add_arguments(p)
    # Priority orders the decode worker's admission, so it needs a queue there: the config caps
    # the running requests at 16 (`moa-pd up --concurrency 8` would start 72).
    raw = json.loads(Path("cfgs/tree_9_3_1_cpu.json").read_text())
    raw["models"]["smollm2"]["server_args"]["torch"]["max_running_requests"] = 16
    capped = tmp_path / "tree_9_3_1_cpu.json"
    capped.write_text(json.dumps(raw))
    base = ["--profile", "tests/data/simulation/profile_cpu.json", "--config", str(capped)]
    base += ["--settings", "3", "--concurrency", "8", "--questions", "8"]
    medians = {}
    for extra in ([], ["--workflow-priority"]):
        assert command.main(p.parse_args(base + extra)) == 0
        out = capsys.readouterr().out
        assert ("workflow priority" in out) == bool(extra)
        row = next(line for line in out.splitlines() if "#3" in line)
        medians[bool(extra)] = float(row.split("│")[3])
    # Eight questions at once on one decode worker: the oldest are served first, so the median
    # question ends sooner (processor sharing ends them all together).
    assert medians[True] < 0.95 * medians[False]


def test_simulate_and_validate_take_the_routers_start_order_and_gate(capsys):
    import argparse

    from simulation import command

    p = argparse.ArgumentParser()
    command.add_arguments(p)
    base = ["--profile", "tests/data/simulation/profile_cpu.json", "--config", "tree_9_3_1_cpu"]
    base += ["--settings", "3", "--concurrency", "4", "--questions", "4"]
    flags = ["--critical-path-first", "--gate-by-slots"]
    assert command.main(p.parse_args(base + flags)) == 0
    assert "critical path first, gate by slots" in capsys.readouterr().out
    # Stop 39's runs were measured by a router whose gate counted slots alone.
    runs = ["tests/data/simulation/tree_c4"]
    args = ["--profile", "tests/data/simulation/profile_cpu.json", "--validate", *runs]
    command.main(p.parse_args([*args, "--gate-by-slots"]))
    by_slots = capsys.readouterr().out
    command.main(p.parse_args(args))
    weighed = capsys.readouterr().out
    cells = [
        next(x for x in out.splitlines() if "#3" in x).split("│")[-2] for out in (by_slots, weighed)
    ]
    (measured, slots), (measured_too, weighs) = (map(float, c.split("/")) for c in cells)
    assert measured == measured_too  # the same run
    assert slots > weighs  # the weighed gate admits fewer


def test_the_pd_path_carries_the_prompts_kv_bytes_over_the_measured_bandwidth():
    """A profile with the PD path per prompt length (`pd`) charges each request its prompt's KV
    transfer: the aggregator's final request (alone, nothing queued) reaches its first token
    later by exactly its prompt's bytes over the bandwidth."""
    per_token = 0.001  # s: kv_bytes_per_token (1) over 1,000 bytes/s
    pd = [PDPoint(prompt_tokens=n, seconds=PD + n * per_token) for n in (16, 1024)]
    slow = model_profile().model_copy(update={"pd": pd})
    assert slow.kv_transfer_bytes_per_second == pytest.approx(1000)
    cfg = tree()

    def final_request(m: ModelProfile):
        prof = profile().model_copy(update={"models": {"m": m}})
        sim = Simulation([cfg], prof, default_deployment([cfg], prof))
        row = sim.run([(from_config(cfg, question_tokens=QUESTION_TOKENS), 2, "blocking", False)])
        s = row.rows[0].agents["s"]
        return s.first_token_s - s.final_request_s, s.prompt_tokens

    fixed, n = final_request(model_profile())
    measured, _ = final_request(slow)
    assert measured - fixed == pytest.approx(n * per_token)


def test_a_tp_group_computes_on_all_its_gpus_and_shares_each_with_its_other_workers():
    """Two GPUs make one TP group tp_speedup(2) = 1.6x faster than one GPU; a worker alone on
    GPU 0 time-shares that GPU with the group, which then runs at its slowest GPU's pace."""
    env = simpy.Environment()
    gpu0, gpu1 = Device(env, "n:gpu0", 1), Device(env, "n:gpu1", 1)
    group = TPGroup(env, "n:gpu0,1", [gpu0, gpu1])
    env.run(until=env.process(group.compute("tp", 1.0)))
    assert env.now == pytest.approx(1 / 1.6)
    assert gpu0.busy_seconds == gpu1.busy_seconds == pytest.approx(1 / 1.6)

    env = simpy.Environment()
    gpu0, gpu1 = Device(env, "n:gpu0", 1), Device(env, "n:gpu1", 1)
    group = TPGroup(env, "n:gpu0,1", [gpu0, gpu1])
    tp = env.process(group.compute("tp", 1.0))
    alone = env.process(gpu0.compute("x", 1.0))
    env.run(until=tp)
    # Both at half speed on GPU 0: the group's 0.625 s of work take 1.25 s...
    assert env.now == pytest.approx(1.25)
    env.run(until=alone)
    # ... and x, half done by then, finishes its other 0.375 s alone.
    assert env.now == pytest.approx(1.625)


def test_a_plan_with_a_tp_group_is_simulated_on_its_gpus():
    assert tp_members("n:gpu0,1") == ["n:gpu0", "n:gpu1"]
    assert tp_members("n:gpu0") == tp_members("n:cpu0,1") == tp_members("n:cpu") == []
    assert tp_members("cpu") == tp_members("gpu3") == []  # the config default's devices
    assert is_gpu("gpu3") and is_gpu("n:gpu0,1") and not is_gpu("cpu")
    assert not is_gpu("gpu-node-1:cpu0,1")  # the kind decides, not a substring of the node
    cfg = tree()

    def e2e(decode_on: str) -> tuple[float, dict[str, float]]:
        workers = (SimWorker("m", "prefill", 0, "n:gpu2"), SimWorker("m", "decode", 0, decode_on))
        gpus = {"n:gpu0": 1, "n:gpu1": 1, "n:gpu2": 1}
        dep = SimDeployment(workers, gpus, "worker", {"m": (4096, 2048)}, "test")
        out = Simulation([cfg], profile(), dep).run(
            [(from_config(cfg, question_tokens=QUESTION_TOKENS), 2, "blocking", False)]
        )
        return out.rows[0].e2e_s, out.device_busy

    one, busy_one = e2e("n:gpu0")
    two, busy_two = e2e("n:gpu0,1")
    assert two < one  # decode steps 1.6x faster on two GPUs
    assert busy_one["n:gpu1"] == 0 and busy_two["n:gpu1"] == pytest.approx(busy_two["n:gpu0"])


def test_the_simulated_device_gate_weighs_the_slowdown_it_measures_as_the_router_does():
    """Prefill and decode on one 2-core device whose co-run slowdown is 0.5 (both busy, each
    runs at 1/1.5 of its speed): the simulated gate reads about that from its decode steps (the
    router's meter, router/decode_slowdown.py, on the simulated clock) and, with questions
    decoding beside each other, refuses warm-ups that do not pay for it (router/compute_device's
    rule); by slots alone it admits them."""
    cfg = tree(min_chunk=2)
    workers = tuple(SimWorker("m", r, 0, "n:cpu") for r in ("prefill", "decode"))

    def run(weighs: bool):
        dep = SimDeployment(
            workers,
            {"n:cpu": 2},
            "device",
            {"m": (4096, 2048)},
            "test",
            co_run_slowdown=0.5,
            gate_weighs_slowdown=weighs,
        )
        sim = Simulation([cfg], fast_prefill, dep, router_costs=RouterCosts())
        work = [(from_config(cfg, f"q{i}"), 3, "pipelined", False) for i in range(40)]
        return sim, sim.run(work, 4)

    # Warm-ups shorter than a decode step (as on this CPU), so the meter sees cold steps too.
    points = [
        PrefillPoint(new_tokens=n, cached_tokens=0, seconds=0.005 + 1e-4 * n) for n in (16, 1024)
    ]
    model = model_profile().model_copy(update={"prefill": points})
    fast_prefill = profile("cpu", 2).model_copy(update={"models": {"m": model}})

    weighing, weighed = run(True)
    _, by_slots = run(False)
    meter = weighing.device_gates["m.decode0"].slowdown
    assert meter.slowdown() == pytest.approx(0.5, abs=0.05)
    warmups = [sum(r.agents["s"].warmups for r in out.rows) for out in (weighed, by_slots)]
    assert 0 < warmups[0] < warmups[1]
