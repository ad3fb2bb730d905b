"""GPU placement on CPU (planning/): memory from config.json, KV pool needs, packing, refusals,
tensor parallelism, start turns with explicit pools, the pool check, `moa-pd plan` and
`up --dry-run`. GPUs come from a fake `nvidia-smi` on PATH; model dirs hold only config.json."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from launch.procs import LaunchError
from planning.gpus import assumed_gpus, parse_nvidia_smi, select_gpus
from planning.model_memory import model_memory
from planning.pack import HEADROOM_MIB, PlanError, place
from planning.pool_need import max_weight_antichain, pool_needs
from planning.prompt_length import prompt_tokens
from planning.types import MIB, WorkerDemand
from router.config_loader import load_config
from router.topology import decode_budget

ROOT = Path(__file__).resolve().parent.parent
# Qwen3 dense shapes, as in their HF config.json files.
# (hidden, intermediate, layers, attention heads, tied embeddings)
QWEN3 = {
    "qwen3-4b": (2560, 9728, 36, 32, True),
    "qwen3-8b": (4096, 12288, 36, 32, False),
    "qwen3-32b": (5120, 25600, 64, 64, False),
}


def qwen3_dir(root: Path, shape: str) -> str:
    d = root / shape
    d.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "head_dim": 128,
        "num_key_value_heads": 8,
        "vocab_size": 151936,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 40960,
        **dict(
            zip(
                (
                    "hidden_size",
                    "intermediate_size",
                    "num_hidden_layers",
                    "num_attention_heads",
                    "tie_word_embeddings",
                ),
                QWEN3[shape],
            )
        ),
    }
    (d / "config.json").write_text(json.dumps(config))
    return str(d)


def fake_nvidia_smi(monkeypatch, folder: Path, n: int, free_mib: int = 81000) -> None:
    """An `nvidia-smi` on PATH printing n H100 rows of the CSV planning.gpus asks for (GPU i's
    UUID is GPU-0000000i-..., for the uuid query); no CUDA_VISIBLE_DEVICES inherited."""
    rows = "".join(f"{i}, NVIDIA H100 80GB HBM3, 81559, {free_mib}\\n" for i in range(n))
    uuids = "".join(f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd, {i}\\n" for i in range(n))
    exe = folder / "bin" / "nvidia-smi"
    exe.parent.mkdir(parents=True, exist_ok=True)
    script = f"case \"$*\" in *uuid*) printf '{uuids}';; *) printf '{rows}';; esac"
    exe.write_text(f"#!/bin/sh\n{script}\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.fixture(scope="module")
def hetero(tmp_path_factory) -> str:
    """tree_9_3_1_hetero with its 4B/8B/32B models as Qwen3-shaped config-only dirs."""
    root = tmp_path_factory.mktemp("models")
    raw = json.loads((ROOT / "cfgs" / "tree_9_3_1_hetero.json").read_text())
    for name, shape in zip(raw["models"], ("qwen3-4b", "qwen3-8b", "qwen3-32b")):
        raw["models"][name]["model_path"] = qwen3_dir(root, shape)
    path = root / "hetero.json"
    path.write_text(json.dumps(raw))
    return str(path)


@pytest.fixture(scope="module")
def pair_8b(tmp_path_factory) -> str:
    """A 1-model config (tree_3_1_cpu's agents) served by a Qwen3-8B shape."""
    root = tmp_path_factory.mktemp("pair")
    raw = json.loads((ROOT / "cfgs" / "tree_3_1_cpu.json").read_text())
    raw["models"] = {"smollm2": {"model_path": qwen3_dir(root, "qwen3-8b")}}
    path = root / "pair.json"
    path.write_text(json.dumps(raw))
    return str(path)


def plan(config_path: str, gpus, policy="pack", concurrency=1, headroom_mib=HEADROOM_MIB):
    from planning.placement import PlacementOptions, placement_for

    opts = PlacementOptions(
        policy=policy, concurrency=concurrency, gpu_memory=gpus, headroom_mib=headroom_mib
    )
    return placement_for([load_config(config_path)], opts)


# --- arithmetic ---------------------------------------------------------------------------------
def test_weights_of_smollm2_match_its_real_parameters():
    from safetensors import safe_open

    from sglang_ext.engine.model_store import resolve_model_path

    model_dir = Path(resolve_model_path("smollm2-135m"))
    stored = 0
    for f in model_dir.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            for key in st.keys():  # noqa: SIM118 - safe_open is no dict
                n = 1
                for dim in st.get_slice(key).get_shape():
                    n *= dim
                stored += n
    mem = model_memory(str(model_dir), dtype="bfloat16")
    assert mem.parameters == stored  # tied embeddings counted once, as stored
    assert mem.weights_bytes == 2 * stored
    cfg = json.loads((model_dir / "config.json").read_text())
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    assert (
        mem.kv_bytes_per_token
        == 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 2
    )


def test_qwen3_shapes_weights_and_kv_per_token(tmp_path):
    m8 = model_memory(qwen3_dir(tmp_path, "qwen3-8b"))
    assert m8.parameters == 8_190_735_360  # Qwen3-8B's published count
    assert m8.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2
    m32 = model_memory(qwen3_dir(tmp_path, "qwen3-32b"), kv_cache_dtype="fp8_e4m3")
    assert m32.weights_bytes == 2 * m32.parameters and m32.kv_bytes_per_token == 2 * 64 * 8 * 128


def test_an_hf_id_outside_the_cache_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    from planning.model_memory import ModelConfigError

    with pytest.raises(ModelConfigError, match="not in the local HF cache.*huggingface-cli"):
        model_memory("Qwen/No-Such-Model")


def test_pool_need_of_a_tree():
    cfg = load_config("tree_3_1_cpu")
    q = 100
    prompts = {a.id: prompt_tokens(cfg, a.id, q) for a in cfg.agents}
    final = cfg.final
    leaves = [a for a in prompts if a != final]
    # The aggregator's prompt holds every leaf's output and the question.
    assert prompts[final] > sum(decode_budget(cfg, a) for a in leaves) + q
    full = {a: prompts[a] + decode_budget(cfg, a) for a in prompts}
    # The leaves run together, the aggregator after them: decode needs the heavier of the two.
    decode = max(sum(full[a] for a in leaves), full[final])
    needs = pool_needs([cfg], 1, q)
    assert needs[("smollm2", "decode")] == decode
    assert needs[("smollm2", "prefill")] == max(
        max(full.values()), max(sum(prompts[a] for a in leaves), prompts[final])
    )
    assert pool_needs([cfg], 3, q)[("smollm2", "decode")] == 3 * decode


def test_antichain_is_the_heaviest_set_of_independent_agents():
    cfg = load_config("tree_9_3_1_cpu")
    ones = {a.id: 1 for a in cfg.agents}
    assert max_weight_antichain(cfg, ones) == 9  # the leaves
    heavy_aggs = {a.id: (10 if a.id.startswith("agg") else 1) for a in cfg.agents}
    # One cluster's aggregator runs while the other clusters' leaves still do.
    assert max_weight_antichain(cfg, heavy_aggs) == 30
    only_final = {cfg.final: 7}
    assert max_weight_antichain(cfg, only_final) == 7


# --- packing ------------------------------------------------------------------------------------
def test_nvidia_smi_table_and_gpu_selection():
    gpus = parse_nvidia_smi("0, NVIDIA H200, 143771, 140000\n1, NVIDIA H200, 143771, 1000\n")
    assert [(g.index, g.name, g.total_mib, g.free_mib) for g in gpus] == [
        (0, "NVIDIA H200", 143771, 140000),
        (1, "NVIDIA H200", 143771, 1000),
    ]
    assert [g.index for g in select_gpus(gpus, "1")] == [1]
    with pytest.raises(PlanError, match="--gpus names GPU 5"):
        select_gpus(gpus, "0,5")
    assert [g.free_mib for g in assumed_gpus("2x80GiB")] == [81920, 81920]
    with pytest.raises(PlanError, match="2x80GiB"):
        assumed_gpus("eighty")


def test_an_inherited_cuda_visible_devices_narrows_the_gpus(tmp_path, monkeypatch):
    """nvidia-smi lists every GPU of the node; placement keeps to those CUDA_VISIBLE_DEVICES
    names (by index or UUID), since each placed worker gets its own CUDA_VISIBLE_DEVICES."""
    from planning.gpus import query_gpus

    fake_nvidia_smi(monkeypatch, tmp_path, 4)
    assert [g.index for g in query_gpus()] == [0, 1, 2, 3]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,2")
    assert [g.index for g in query_gpus()] == [3, 2]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-00000001,GPU-00000002-aaaa")
    assert [g.index for g in query_gpus()] == [1, 2]
    for bad, msg in (
        ("", "set but empty"),
        ("7", "names '7', which is none of the GPUs nvidia-smi lists"),
        ("GPU-0000", "names 'GPU-0000'"),  # a prefix of several UUIDs
        ("MIG-1234", "MIG instances are not supported"),
    ):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", bad)
        with pytest.raises(PlanError, match=msg):
            query_gpus()


def test_every_placed_worker_sees_only_its_gpus_in_pci_bus_order(pair_8b):
    """CUDA numbers GPUs fastest-first and within an inherited CUDA_VISIBLE_DEVICES; placement
    numbers them as nvidia-smi does. So a worker on GPU 1 (tp=1 too) sees only GPU 1, in PCI
    bus order, as its device 0."""
    from launch.worker_cmd import placement_flags

    p = plan(pair_8b, "2x80GiB", policy="one-per-worker")
    for w in p.workers:
        flags, env = placement_flags(w)
        assert flags[flags.index("--base-gpu-id") + 1] == "0" and "--tp-size" not in flags
        assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(w.gpus[0])}
    assert sorted(placement_flags(w)[1]["CUDA_VISIBLE_DEVICES"] for w in p.workers) == ["0", "1"]


def test_a_pd_pair_shares_one_gpu_in_turns(pair_8b):
    p = plan(pair_8b, "1x80GiB")
    prefill, decode = p.worker("smollm2.prefill0"), p.worker("smollm2.decode0")
    assert prefill.gpus == decode.gpus == (0,)
    assert sorted([prefill.turn, decode.turn]) == [0, 1]
    for w in (prefill, decode):
        assert w.pool_tokens == w.demand.pool_tokens > 0
    assert p.used_mib(0) <= 81920
    # The later turn sees less free memory, so it needs a larger fraction for its pool.
    first, second = sorted((prefill, decode), key=lambda w: w.turn)
    left = 81920 - p.used_mib(0) + (second.weights_mib + second.pool_mib + HEADROOM_MIB)
    assert left < 81920
    assert first.mem_fraction_static < (first.weights_mib + first.pool_mib + 2048) / 81920
    assert second.mem_fraction_static > (second.weights_mib + second.pool_mib) / left


@pytest.mark.parametrize("n_gpus", [1, 2])
def test_the_hetero_tree_is_refused_on_too_few_gpus(hetero, n_gpus):
    with pytest.raises(PlanError) as info:
        plan(hetero, f"{n_gpus}x80GiB")
    msg = str(info.value)
    assert "does not fit" in msg and "MiB free of 81,920" in msg
    assert "model 'qwen3vl-" in msg and "GPU " in msg and "needs" in msg


def test_the_hetero_tree_fits_four_gpus(hetero):
    p = plan(hetero, "4x80GiB")
    assert len(p.workers) == 6 and all(w.demand.tp == 1 for w in p.workers)
    big = [w for w in p.workers if w.demand.model == "qwen3vl-32b"]
    assert big[0].gpus != big[1].gpus  # two 61 GiB models cannot share an 80 GiB GPU
    for g in p.gpus:
        assert p.used_mib(g.index) <= g.free_mib
        on = sorted(w.turn for w in p.workers if g.index in w.gpus)
        assert on == list(range(len(on)))  # one after the other
    # With 20 GiB of headroom per worker the 32B model needs two GPUs, and 4 GPUs are too few.
    roomy = plan(hetero, "8x80GiB", headroom_mib=20000)
    assert {w.demand.tp for w in roomy.workers if w.demand.model == "qwen3vl-32b"} == {2}
    with pytest.raises(PlanError, match="does not fit.*headroom 20,000"):
        plan(hetero, "4x80GiB", headroom_mib=20000)


def test_tensor_parallel_for_a_model_bigger_than_one_gpu(tmp_path):
    mem = model_memory(qwen3_dir(tmp_path, "qwen3-32b"))
    d = WorkerDemand("big", "decode", 0, 1, mem.weights_bytes, mem.kv_bytes_per_token, 10_000)
    from planning.pack import choose_tp

    gpus = assumed_gpus("4x40GiB")
    assert choose_tp(d, gpus) == 2
    from dataclasses import replace

    p = place([replace(d, tp=2), replace(d, replica=1, tp=2)], gpus)
    assert sorted(w.gpus for w in p.workers) == [(0, 1), (2, 3)]
    from launch.worker_cmd import placement_flags

    flags, env = placement_flags(p.workers[0])
    assert flags[flags.index("--tp-size") + 1] == "2"
    assert flags[flags.index("--base-gpu-id") + 1] == "0"
    assert env["CUDA_VISIBLE_DEVICES"] in ("0,1", "2,3")
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    with pytest.raises(PlanError, match="model 'big' does not fit"):
        choose_tp(d, assumed_gpus("1x40GiB"))


def test_a_headroom_below_what_the_fraction_reserves_is_refused(pair_8b):
    """--mem-fraction-static takes the CUDA context and the loading slack out of the headroom:
    below their sum a plan would give SGLang a fraction >= 1, which it rejects."""
    from planning.pack import MIN_HEADROOM_MIB

    assert MIN_HEADROOM_MIB == 1792
    with pytest.raises(PlanError, match="--gpu-headroom-mib 1000 is below the minimum 1792"):
        plan(pair_8b, "1x80GiB", headroom_mib=1000)
    with pytest.raises(PlanError, match="--gpu-headroom-mib 0 is below"):
        place([], assumed_gpus("1x80GiB"), headroom_mib=0)
    # At the minimum, a worker alone on its GPU grows its pool into everything: fraction 1.
    with pytest.raises(PlanError, match=r"--mem-fraction-static 1\.000 >= 1.*raise --gpu-headroom"):
        plan(pair_8b, "2x80GiB", policy="one-per-worker", headroom_mib=MIN_HEADROOM_MIB)
    fractions = [w.mem_fraction_static for w in plan(pair_8b, "1x80GiB", headroom_mib=1792).workers]
    assert all(0 < f < 1 for f in fractions)


def test_a_model_no_agent_uses_is_refused(pair_8b, tmp_path):
    raw = json.loads(Path(pair_8b).read_text())
    raw["models"]["spare"] = dict(raw["models"]["smollm2"])
    path = tmp_path / "spare.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(PlanError, match="model 'spare' is declared but no agent uses it"):
        plan(str(path), "1x80GiB")


def test_one_per_worker_policy(pair_8b):
    p = plan(pair_8b, "2x80GiB", policy="one-per-worker")
    assert sorted(w.gpus for w in p.workers) == [(0,), (1,)]
    assert all(w.turn == 0 for w in p.workers)
    # Alone on its GPU, a worker's pool takes what weights and headroom leave.
    for w in p.workers:
        assert w.pool_tokens > w.demand.pool_tokens
        assert p.used_mib(w.gpus[0]) == pytest.approx(81920, abs=1)
    with pytest.raises(PlanError, match="one-per-worker.*--gpu-policy pack"):
        plan(pair_8b, "1x80GiB", policy="one-per-worker")
    assert HEADROOM_MIB * MIB > 0


# --- start order and the pool check -------------------------------------------------------------
def test_workers_sharing_a_gpu_start_in_turns_with_explicit_pools(pair_8b, tmp_path, monkeypatch):
    """Stack with a fake nvidia-smi, and a recorder in place of process starts: the decode and
    prefill worker of one GPU start in two batches, each healthy and pool-checked before the
    next, each with --max-total-tokens and its turn's --mem-fraction-static."""
    import launch.stack as stack_mod
    from launch.commands import make_stack

    fake_nvidia_smi(monkeypatch, tmp_path, 1)
    events: list[tuple[str, list[str]]] = []

    class Stop(Exception):
        pass

    def fake_start(spec, log_dir, die_with_parent=True):
        if spec.name.endswith(".router"):
            raise Stop
        events.append(("start", [spec.name]))
        return SimpleNamespace(spec=spec, pid=0)

    monkeypatch.setattr(stack_mod, "start", fake_start)
    monkeypatch.setattr(stack_mod, "write_pidfile", lambda *a: None)
    monkeypatch.setattr(stack_mod, "stop_groups", lambda pids: None)
    monkeypatch.setattr(
        stack_mod,
        "wait_healthy",
        lambda procs, *a: events.append(("healthy", [p.spec.name for p in procs])),
    )
    monkeypatch.setattr(
        stack_mod,
        "check_pools",
        lambda procs, *a: events.append(("pools", [p.spec.name for p in procs])),
    )
    stack = make_stack([pair_8b], "sglang", tmp_path / "run", "127.0.0.1")
    stack.plan()
    specs = {s.name: s for s in stack.worker_specs()}
    with pytest.raises(Stop):
        stack.up()
    first, second = sorted(stack.placement.workers, key=lambda w: w.turn)
    assert [e for e in events if e[0] != "healthy" or e[1]] == [
        ("start", [first.name]),
        ("healthy", [first.name]),
        ("pools", [first.name]),
        ("start", [second.name]),
        ("healthy", [second.name]),
        ("pools", [second.name]),
    ]
    for w in (first, second):
        argv = specs[w.name].argv
        assert argv[argv.index("--max-total-tokens") + 1] == str(w.pool_tokens)
        fraction = argv[argv.index("--mem-fraction-static") + 1]
        assert fraction == f"{w.mem_fraction_static:.3f}"
        assert argv[argv.index("--base-gpu-id") + 1] == "0"
        assert specs[w.name].env["CUDA_VISIBLE_DEVICES"] == "0"
        assert specs[w.name].env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    # The router's warm-up gate sees both workers on one GPU, a device of one slot.
    cluster = stack.cluster()
    assert cluster["devices"] == {"cuda:0": 1}
    (model,) = cluster["models"].values()
    assert model["prefill_devices"] == model["decode_devices"] == ["cuda:0"]
    assert cluster["warmup_gate_scope"] == "worker"  # unmeasured on GPUs: the per-worker gate


@pytest.mark.slow
def test_a_worker_whose_pool_is_below_the_need_fails_the_start(tmp_path):
    """A reference-engine PD pair whose config caps its pool below what its agents need."""
    from launch.stack import Stack
    from tests.deployment_procs import tiny_config

    raw = json.loads(Path(tiny_config(tmp_path)).read_text())
    raw["models"]["smollm2"]["server_args"]["torch"]["max_total_tokens"] = 64
    path = tmp_path / "small_pool.json"
    path.write_text(json.dumps(raw))
    cfg = load_config(str(path))
    needs = pool_needs([cfg])
    stack = Stack([cfg], [str(path)], "torch", tmp_path / "run", pool_needs=needs)
    with pytest.raises(LaunchError) as info:
        stack.up()
    msg = str(info.value)
    assert "started with a KV pool of 64 tokens, below the" in msg
    assert f"{needs[('smollm2', 'prefill')]:,}" in msg or f"{needs[('smollm2', 'decode')]:,}" in msg
    assert stack.procs == []


# --- the command line ---------------------------------------------------------------------------
def test_moa_pd_plan_prints_the_placement(hetero, tmp_path, monkeypatch, capsys):
    from launch.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    fake_nvidia_smi(monkeypatch, tmp_path, 4)
    assert main(["plan", "--config", hetero]) == 0
    out = capsys.readouterr().out
    for name in ("qwen3vl-32b.prefill0", "qwen3vl-8b.decode0", "qwen3vl-4b.prefill0"):
        assert name in out
    assert "NVIDIA H100 80GB HBM3" in out and "policy pack" in out
    assert main(["plan", "--config", hetero, "--gpus", "0,1"]) == 2
    assert "does not fit" in capsys.readouterr().err


def test_up_dry_run_prints_the_plan_and_starts_nothing(pair_8b, tmp_path, monkeypatch, capsys):
    from launch.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    fake_nvidia_smi(monkeypatch, tmp_path, 2)
    run_dir = tmp_path / "run"
    argv = [
        "up",
        "--backend",
        "sglang",
        "--dry-run",
        "--config",
        pair_8b,
        "--run-dir",
        str(run_dir),
    ]
    assert main([*argv, "--gpu-policy", "one-per-worker"]) == 0
    out = capsys.readouterr().out
    assert "smollm2.prefill0" in out and "one-per-worker" in out
    assert not run_dir.exists()
    assert main([*argv, "--gpu-memory", "1x24GiB", "--concurrency", "64"]) == 2
    assert "does not fit" in capsys.readouterr().err


def test_the_microbench_packs_its_workers_onto_one_gpu(tmp_path, monkeypatch):
    """`python -m benchmarks.microbench --backend sglang` on one GPU: its four workers share it in
    turns, each with the benchmark's own pool."""
    from benchmarks.microbench_deploy import Deployment, worker_spec

    fake_nvidia_smi(monkeypatch, tmp_path, 1, free_mib=140000)
    model = qwen3_dir(tmp_path, "qwen3-4b")
    dep = Deployment(model, "127.0.0.1", 2048, tmp_path / "logs", backend="sglang")
    names = ["pd.prefill", "pd.decode", "dp0", "dp1"]
    placed = dep._placements(names)
    assert sorted(w.turn for w in placed.values()) == [0, 1, 2, 3]
    assert {w.gpus for w in placed.values()} == {(0,)}
    spec = worker_spec("dp1", model, "null", "127.0.0.1", dep.args, "sglang", placed=placed["dp1"])
    argv = spec.argv
    assert argv[argv.index("--max-total-tokens") + 1] == str(dep.args["max_total_tokens"])
    assert "--device" not in argv and "--mem-fraction-static" in argv
    fake_nvidia_smi(monkeypatch, tmp_path, 1, free_mib=20000)
    with pytest.raises(LaunchError, match="does not fit"):
        dep._placements(names)


def test_the_microbench_restarts_on_a_stolen_port_and_checks_pools(tmp_path, monkeypatch):
    """Deployment.up with a recorder in place of process starts: a worker whose port another
    process took starts again with new ports (the router gets them), the router is waited on
    until it routes, and a placed worker whose pool came up short fails the start."""
    import benchmarks.microbench_deploy as md
    from launch import pool_check, ports

    fake_nvidia_smi(monkeypatch, tmp_path, 1, free_mib=140000)
    model = qwen3_dir(tmp_path, "qwen3-4b")
    stolen: set[int] = set()
    started: list = []
    routed: list[str] = []
    short: set[str] = set()  # workers whose pool comes up short

    def fake_start(spec, log_dir):
        if not stolen:
            stolen.add(spec.ports[0])  # taken by someone else between choice and start
        started.append(spec)
        return SimpleNamespace(spec=spec, pid=0)

    def fake_wait_healthy(procs, timeout):
        if any(port in stolen for p in procs for port in p.spec.ports):
            raise LaunchError(f"{procs[0].spec.name} exited with code 1 during start-up")

    def fake_pool_tokens(url):
        names = {md.base_url(s): s.name for s in started}
        return 100 if names[url] in short else need

    monkeypatch.setattr(md, "start", fake_start)
    monkeypatch.setattr(md, "wait_healthy", fake_wait_healthy)
    monkeypatch.setattr(md, "stop_groups", lambda pids: None)
    monkeypatch.setattr(md, "wait_routable", lambda url, timeout, proc: routed.append(url))
    monkeypatch.setattr(ports, "port_in_use", lambda port, host="127.0.0.1": port in stolen)
    monkeypatch.setattr(pool_check, "pool_tokens", fake_pool_tokens)

    def deployment():
        return md.Deployment(
            model,
            "127.0.0.1",
            2048,
            tmp_path / "logs",
            backend="sglang",
            variants=("incremental", "pd"),
        )

    dep = deployment()
    need = dep.args["max_total_tokens"]
    dep.up()
    first, again, second, router = started
    assert first.name == again.name and {first.name, second.name} == {"pd.prefill", "pd.decode"}
    assert router.name == "router" and len(dep.procs) == 3
    assert not set(again.ports) & set(first.ports) and not set(again.ports) & stolen
    prefill = again if again.name == "pd.prefill" else second
    assert dep.prefill_url == md.base_url(prefill)
    assert md.base_url(prefill) in router.argv and str(prefill.ports[1]) in router.argv
    assert routed == [dep.router_url]

    started.clear()
    short.add("pd.decode")
    with pytest.raises(
        LaunchError,
        match=f"pd.decode started with a KV pool of 100 tokens, below the {need:,} the microbench sets",
    ):
        deployment().up()
