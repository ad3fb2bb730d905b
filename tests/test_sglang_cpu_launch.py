"""Launch side of real SGLang without a GPU, and the pieces every deployment shares, with no
process started: `moa-pd up --backend sglang` picks SGLang's CPU path and adds its flags and
environment per role; the one sglang-router command line; hub ids of embedding models resolve
from the hub cache, or fail at `moa-pd up` with the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import planning.gpus
from launch.commands import make_stack
from launch.procs import LaunchError
from launch.stack import SGLANG_HEALTH_PROBE_S, Stack
from launch.worker_cmd import router_argv
from router.cluster import ClusterSpec
from router.config_loader import load_config
from router.embedder import resolve_model_path


def cpu_config(tmp_path: Path):
    """tree_3_1_cpu with its model at a stand-in local directory (nothing is loaded)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    cfg = load_config("tree_3_1_cpu")
    spec = cfg.models["smollm2"].model_copy(update={"model_path": str(model)})
    return cfg.model_copy(update={"models": {"smollm2": spec}}), model


def test_up_without_a_gpu_runs_sglang_on_its_cpu_path(tmp_path, monkeypatch):
    monkeypatch.setattr(planning.gpus, "has_nvidia_gpus", lambda: False)
    stack = make_stack(["tree_3_1_cpu"], "sglang", tmp_path / "run", "127.0.0.1")
    assert stack.sglang_cpu and stack.placement is None
    assert not make_stack(["tree_3_1_cpu"], "torch", tmp_path / "r2", "127.0.0.1").sglang_cpu


def test_cpu_path_flags_and_environment_per_role(tmp_path):
    cfg, model = cpu_config(tmp_path)
    stack = Stack([cfg], [], "sglang", tmp_path, sglang_cpu=True)
    stack.plan()
    specs = {s.name: s for s in stack.worker_specs()}
    prefill, decode = specs["smollm2.prefill0"], specs["smollm2.decode0"]
    for spec in (prefill, decode):
        argv = spec.argv
        assert argv[argv.index("--backend") + 1] == "sglang"
        assert argv[argv.index("--model-path") + 1] == str(model)
        assert argv[argv.index("--device") + 1] == "cpu"
        assert argv[argv.index("--attention-backend") + 1] == "torch_native"
        assert "--base-gpu-id" not in argv
        assert spec.env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert "--disaggregation-decode-retraction-backup" in decode.argv
    assert "--disaggregation-decode-retraction-backup" not in prefill.argv
    assert prefill.env["SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX"] == "0"
    assert "SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX" not in decode.env


def test_up_writes_the_warmup_verb_for_the_shell_router(tmp_path):
    cfg, _ = cpu_config(tmp_path)
    for verb in ("generate", "prefill_only"):
        stack = Stack([cfg], [], "torch", tmp_path, warmup_verb=verb)
        stack.plan()
        assert ClusterSpec.model_validate(stack.cluster()).warmup_verb == verb


def test_sglang_workers_get_the_longer_health_probe(tmp_path):
    """SGLang's /health is a generation behind the running batch: a 2.5 s probe called a busy
    CPU prefill worker hung, so the launcher gives SGLang workers SGLANG_HEALTH_PROBE_S."""
    cfg, _ = cpu_config(tmp_path)
    for backend, probe_s in (("torch", 2.5), ("sglang", SGLANG_HEALTH_PROBE_S)):
        stack = Stack([cfg], [], backend, tmp_path)
        stack.plan()
        assert ClusterSpec.model_validate(stack.cluster()).timeouts.health_probe_s == probe_s


def test_the_one_router_command_line():
    argv = router_argv(
        [("http://h:1", 11), ("http://h:2", 12)],
        ["http://h:3"],
        "h",
        4,
        "h",
        5,
        ["--log-level", "warn"],
        python="py",
    )
    assert argv == [
        "py",
        "-m",
        "launch.native_router",
        "--pd-disaggregation",
        "--prefill",
        "http://h:1",
        "11",
        "--prefill",
        "http://h:2",
        "12",
        "--decode",
        "http://h:3",
        "--host",
        "h",
        "--port",
        "4",
        "--prometheus-host",
        "h",
        "--prometheus-port",
        "5",
        "--log-level",
        "warn",
    ]


def fake_hub_cache(root: Path, repo_id: str) -> Path:
    """A stand-in hub cache holding one snapshot of repo_id, laid out as huggingface_hub does."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    return snapshot


def test_hub_id_resolves_from_the_hub_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    snapshot = fake_hub_cache(tmp_path, "Qwen/Qwen3-Embedding-4B")
    assert resolve_model_path("Qwen/Qwen3-Embedding-4B") == snapshot
    with pytest.raises(ValueError, match=r"hf download Qwen/Qwen3-Embedding-8B"):
        resolve_model_path("Qwen/Qwen3-Embedding-8B")
    with pytest.raises(ValueError, match="neither"):
        resolve_model_path(str(tmp_path / "no-such-dir"))


def test_up_fails_before_starting_when_the_embedder_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    cfg, _ = cpu_config(tmp_path)
    ee = cfg.early_exit.model_copy(
        update={"enabled": True, "embedding_model": "Qwen/Qwen3-Embedding-4B"}
    )
    stack = Stack([cfg.model_copy(update={"early_exit": ee})], [], "torch", tmp_path)
    with pytest.raises(LaunchError, match="not in the local hub cache"):
        stack.plan()
    fake_hub_cache(tmp_path, "Qwen/Qwen3-Embedding-4B")
    stack.plan()
