"""GPU validation of the real-SGLang backend, as tests (they replace launch/gpu_validate.sh).

Marked `gpu`: each skips, with the reason, where there is no CUDA GPU, no real SGLang, or no real
weights (MOA_PD_GPU_MODEL: a local HF model directory with safetensors, e.g. Qwen3-0.6B). They
share the checks of the CPU suite (tests/sglang_real.py): one PD pair (prefill + decode through our
patched launcher, NIXL, the real sglang-router) started through launch.procs and stopped by
process group on every exit path; `--attention-backend fa3` with deterministic inference (without
it the radix cache is disabled, or 0.5.3 refuses the flag); caches flushed between measurements.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest
import requests
from router_fixtures import tree_config
from sglang_real import deployment_cluster, flush, greedy, router_warmup

from launch.ports import free_port
from launch.procs import ProcSpec, start, stop_group, wait_healthy
from router.context import RouterContext
from router.orchestrator import Session
from sglang_ext import protocol as P
from sglang_ext.patch import check_version, patch_plan
from sglang_ext.sglang_backend.pair import PDPairSpec, pd_pair_commands

pytestmark = pytest.mark.gpu

MODEL_ENV = "MOA_PD_GPU_MODEL"
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
DETERMINISTIC = ("--attention-backend", "fa3", "--enable-deterministic-inference")
PREFIX_TOKENS = 1500


def version_case(version: str) -> str | None:
    """The case of VERSION_CASES that `version` belongs to, or None."""
    from sglang_ext.patch.version import release

    rel = release(version)
    return next((c for c, (lo, hi) in VERSION_CASES.items() if lo <= rel <= hi), None)


def test_version_cases_cover_the_list():
    assert version_case("0.5.11") == "0.5.11"
    assert version_case("0.5.12") == version_case("0.5.22") == "0.5.12+"
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


@pytest.fixture(scope="module")
def model_dir() -> str:
    path = Path(os.environ.get(MODEL_ENV, ""))
    if not os.environ.get(MODEL_ENV) or not (path / "config.json").is_file():
        pytest.skip(f"set {MODEL_ENV} to a local HF model directory with real weights")
    if not any(path.glob("*.safetensors")):
        pytest.skip(f"{path} has no *.safetensors: these checks need real weights")
    return str(path)


@pytest.fixture(scope="module")
def pair(gpus, model_dir, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("gpu-pair")
    spec = PDPairSpec(
        model_path=model_dir,
        prefill_port=free_port(),
        decode_port=free_port(),
        router_port=free_port(),
        router_metrics_port=free_port(),
        bootstrap_port=free_port(),
        decode_gpu=1 if gpus > 1 else 0,
        mem_fraction_static=0.8 if gpus > 1 else 0.35,
        prefill_args=DETERMINISTIC,
        decode_args=DETERMINISTIC,
    )
    cmds = pd_pair_commands(spec)
    started = []
    try:
        workers = [
            start(ProcSpec(r, cmds[r], spec.url(r) + "/health"), log_dir)
            for r in ("prefill", "decode")
        ]
        started += workers
        wait_healthy(workers, 900)
        router = start(ProcSpec("router", cmds["router"], spec.url("router") + "/health"), log_dir)
        started.append(router)
        wait_healthy([router], 300)
        greedy(spec.url("router"), [1, 2, 3], 1)
        cluster = {
            "models": {
                "m": {
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


def test_patch_applied_in_every_worker(pair):
    _, started, _ = pair
    for proc in started[:2]:
        log = proc.log_path.read_text(errors="replace")
        assert "moa-pd patch prefill_only_route applied" in log
        assert "moa-pd: fake-host requests with rid prefix" in log


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


def test_ttft_with_and_without_warmups(pair, record_property):
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
    print(f"TTFT median: cold {cold[1]:.4f} s, after a warm-up {warm[1]:.4f} s")
    assert warm[1] < cold[1]


async def test_pipelined_equals_blocking(pair):
    spec, _, cluster = pair
    cfg = tree_config("tree_3_1_cpu", max_new_tokens=16)
    cfg = cfg.model_copy(
        update={
            "models": {"m": cfg.models["smollm2"]},
            "agents": [a.model_copy(update={"model": "m"}) for a in cfg.agents],
        }
    )
    urls = [spec.url("prefill"), spec.url("decode")]
    async with RouterContext.open(deployment_cluster(cluster)) as ctx:
        flush(*urls)
        piped = await Session(ctx, cfg, "What is 7 times 8?", "pipelined").run_all()
        orders = {a: t["slot_order"] for a, t in piped.trace.items() if t["slot_order"]}
        flush(*urls)
        blocked = await Session(
            ctx, cfg, "What is 7 times 8?", "blocking", slot_orders=orders
        ).run_all()
    for agent, t in piped.trace.items():
        assert t["output_ids"] and t["output_ids"] == blocked.trace[agent]["output_ids"], agent
