"""`moa-pd up` and `moa-pd run` with `--backend sglang` on one GPU (marker `gpu`; issue 19 items
1-3), on weight-free models: the PD pair of `single_8b_dummy_gpu` (the Qwen3-8B shape) with both
workers on one GPU, and settings #2 and #3 on the dummy 9-3-1 tree.

An 80 GB card cannot hold the paper's 4B/8B/32B trio as three PD pairs (the 32B shape alone is
~61 GiB of weights per worker), so the tree runs on the largest trio that fits: MOA_PD_GPU_TRIO
(three different shapes, e.g. "qwen3-4b,qwen3-8b,qwen3-14b") if set, else the first of TRIOS that
`moa-pd plan` accepts on the chosen GPU. The trio that ran is in the test output. With several
GPUs the deployment is restricted (`--gpus`) to the one with most free memory. Answers are shortened tenfold (30/50/70 tokens, ignore_eos) to keep the run short.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sglang_real import deployment_cluster, greedy, pool_tokens, router_warmup
from test_sglang_gpu import attention, dummy_model_dir, gpus, sglang_case  # noqa: F401

from benchmarks.gpu.fit_config import fit
from experiments.results import read_results
from launch.ports import port_in_use
from planning.gpus import query_gpus
from planning.pool_need import pool_needs
from router.config_loader import load_config, resolve_config_path
from sglang_ext import protocol as P
from sglang_ext.engine.dummy_model import SHAPES
from sglang_ext.sglang_backend import gpu as sglang_gpu

pytestmark = pytest.mark.gpu

SINGLE = "single_8b_dummy_gpu"
TREE = "tree_9_3_1_dummy_gpu"
TRIO_ENV = "MOA_PD_GPU_TRIO"
# Largest first: the paper's trio (several GPUs), one H200, one 80 GB H100.
TRIOS = (
    ("qwen3-4b", "qwen3-8b", "qwen3-32b"),
    ("qwen3-4b", "qwen3-8b", "qwen3-14b"),
    ("qwen3-1.7b", "qwen3-4b", "qwen3-8b"),
)
LENGTH_DIVISOR = 10
PREFIX_TOKENS = 1500


def moa_pd(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", "import sys; from launch.cli import main; sys.exit(main())"]
    return subprocess.run(
        [*cmd, *args], check=False, capture_output=True, text=True, timeout=timeout
    )


def one_gpu_args(gpu: int) -> list[str]:
    return ["--gpus", str(gpu)]


@pytest.fixture(scope="module")
def gpu(gpus, attention) -> int:  # noqa: F811
    """The GPU with most free memory: the deployment's only one (test ids name the attention
    backend the launcher picks, sglang_backend/gpu.py)."""
    return max(query_gpus(), key=lambda g: (g.free_mib, -g.index)).index


def expected_attention(argv: list[str]) -> None:
    if sglang_gpu.has_fa3():  # SGLang's own default on Hopper
        assert "--attention-backend" not in argv or "fa3" in argv
    else:
        assert argv[argv.index("--attention-backend") + 1] == "triton", argv


def check_workers_share_the_gpu(
    cluster: dict, gpu: int | None, needs: dict[tuple[str, str], int] | None
) -> None:
    """Every worker on `gpu`, with dummy weights and the patch applied; while they run (needs
    given: planning's pool_needs of the config), each with a pool of at least its need."""
    for name, model in cluster["models"].items():
        if gpu is not None:  # each worker sees only its GPU (CUDA_VISIBLE_DEVICES), as cuda:0
            device = f"cuda:{gpu}"
            assert model["prefill_devices"] == [device] * len(model["prefill_urls"]), name
            assert model["decode_devices"] == [device] * len(model["decode_urls"]), name
        for url, proc in model["processes"].items():
            role = proc["name"].split(".")[-1].rstrip("0123456789")
            if role not in ("prefill", "decode"):
                continue
            log = Path(proc["log"]).read_text(errors="replace")
            argv = log.splitlines()[0].split()
            assert argv[argv.index("--base-gpu-id") + 1] == "0", (name, argv)
            assert argv[argv.index("--load-format") + 1] == "dummy", (name, argv)
            expected_attention(argv)
            assert "moa-pd patch prefill_only_route applied" in log, proc["log"]
            if needs is not None:
                assert pool_tokens(url) >= needs[(name, role)], (name, role, url, needs)


# --- moa-pd up: one PD pair on one GPU --------------------------------------------------------


@pytest.fixture(scope="module")
def single_up(gpu, tmp_path_factory):
    dummy_model_dir("dummy:qwen3-8b")  # skips where the shape-only model cannot be written
    run_dir = tmp_path_factory.mktemp("gpu-up") / "run"
    up = moa_pd(
        "up",
        "--config",
        SINGLE,
        "--backend",
        "sglang",
        "--detach",
        "--run-dir",
        str(run_dir),
        *one_gpu_args(gpu),
    )
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        yield json.loads((run_dir / "cluster.json").read_text()), run_dir
    finally:
        if (run_dir / "processes.json").exists():
            moa_pd("down", "--run-dir", str(run_dir), timeout=120)


def test_up_places_the_pd_pair_on_one_gpu(single_up, gpu, gpus):  # noqa: F811
    cluster, _ = single_up
    (model,) = cluster["models"].values()
    assert len(model["prefill_urls"]) == len(model["decode_urls"]) == 1
    # `moa-pd up`'s defaults: concurrency 1, the default question allowance.
    check_workers_share_the_gpu(cluster, gpu, pool_needs([load_config(SINGLE)]))
    print(f"moa-pd up: PD pair on GPU {gpu}, attention {sglang_gpu.attention_backend()}")


def test_up_serves_exact_lengths_and_hits_warmups_through_the_router(single_up):
    cluster, _ = single_up
    name, model = next(iter(cluster["models"].items()))
    out = greedy(model["router_url"], list(range(1000, 1100)), 64)  # ignore_eos
    assert len(out[P.OUTPUT_IDS]) == 64
    prefix = [1000 + (hash((uuid.uuid4().hex, i)) % 20000) for i in range(PREFIX_TOKENS)]
    meta = router_warmup(deployment_cluster(cluster), prefix, uuid.uuid4().hex, name)
    assert meta[P.PROMPT_TOKENS] == PREFIX_TOKENS
    out = greedy(model["router_url"], prefix + list(range(2000, 2016)))
    assert out[P.META_INFO][P.CACHED_TOKENS] >= PREFIX_TOKENS - 64  # whole pages only


def test_down_stops_the_pair(single_up):
    cluster, run_dir = single_up
    (model,) = cluster["models"].values()
    down = moa_pd("down", "--run-dir", str(run_dir), timeout=120)
    assert down.returncode == 0, down.stderr
    for url in [*model["prefill_urls"], *model["decode_urls"], model["router_url"]]:
        assert not port_in_use(int(url.rsplit(":", 1)[1])), url


# --- moa-pd run --settings 2,3 on the dummy 9-3-1 tree --------------------------------------


def trio_config(trio: tuple[str, str, str], out_dir: Path) -> Path:
    """tree_9_3_1_dummy_gpu with its 4B/8B/32B shapes replaced by `trio` (fit_config's swap) and
    every answer LENGTH_DIVISOR times shorter."""
    raw = json.loads(resolve_config_path(TREE).read_text())
    mapping = dict(zip(("qwen3-4b", "qwen3-8b", "qwen3-32b"), trio, strict=True))
    raw = fit(raw, mapping, suffix="_" + "_".join(s.removeprefix("qwen3-") for s in trio))
    raw["sampling"]["max_new_tokens"] //= LENGTH_DIVISOR
    for agent in raw["agents"]:
        for key in ("max_new_tokens", "min_new_tokens"):
            if key in agent.get("sampling", {}):
                agent["sampling"][key] //= LENGTH_DIVISOR
    path = out_dir / f"{raw['name']}.json"
    path.write_text(json.dumps(raw, indent=2))
    load_config(path)  # still a valid config
    return path


def trio_fits(config: Path, gpu: int) -> bool:
    """`moa-pd plan` accepts it on `gpu` (planning/ packs the workers by memory)."""
    plan = moa_pd("plan", "--config", str(config), *one_gpu_args(gpu), timeout=300)
    if "usage:" in plan.stderr:  # a changed command line must not pass as "does not fit"
        pytest.fail(f"moa-pd plan --config {config}: {plan.stderr[-1500:]}")
    return plan.returncode == 0


@pytest.fixture(scope="module")
def trio_tree(gpu, tmp_path_factory) -> tuple[tuple[str, ...], Path]:
    out = tmp_path_factory.mktemp("trio")
    if env := os.environ.get(TRIO_ENV):
        trio = tuple(s.strip() for s in env.split(","))
        unknown = [s for s in trio if s not in SHAPES]
        if len(set(trio)) != 3 or unknown:
            pytest.fail(f"{TRIO_ENV}={env!r}: name three different shapes from {', '.join(SHAPES)}")
        return trio, trio_config(trio, out)
    for trio in TRIOS:
        path = trio_config(trio, out)
        if trio_fits(path, gpu):
            return trio, path
    pytest.skip(f"no trio of {TRIOS} fits GPU {gpu}; set {TRIO_ENV} to smaller shapes")


# Six workers start in turns (~4 min on an H200 with Triton's first compiles), then two settings
# run: over the suite's 300 s default.
@pytest.mark.timeout(1500)
def test_run_settings_2_and_3_on_the_dummy_tree_on_one_gpu(trio_tree, gpu, gpus, tmp_path):  # noqa: F811
    trio, config = trio_tree
    for shape in dict.fromkeys(trio):
        dummy_model_dir(f"dummy:{shape}")
    out = tmp_path / "run"
    run = moa_pd(
        "run",
        "--config",
        str(config),
        "--dataset",
        "gsm8k",
        "--num-samples",
        "2",
        "--settings",
        "2,3",
        "--backend",
        "sglang",
        "--out",
        str(out),
        *one_gpu_args(gpu),
    )
    print(f"moa-pd run on GPU {gpu}: trio {'/'.join(trio)}, {sglang_gpu.attention_backend()}")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    cfg = load_config(config)
    rows = read_results(out / "results.jsonl")
    assert sorted((r.sample_id, r.setting) for r in rows) == sorted(
        (f"gsm8k-test-{i:04d}", s) for i in range(2) for s in (2, 3)
    )
    for r in rows:
        assert r.ok, r.error
        assert set(r.agents) == {a.id for a in cfg.agents}
        for aid, a in r.agents.items():  # ignore_eos: every answer has its fixed length
            assert len(a.output_ids) == cfg.sampling_of(aid).max_new_tokens, (r.setting, aid)
    deployment = json.loads((out / "deployment" / "cluster.json").read_text())
    assert set(deployment["models"]) == set(trio)
    check_workers_share_the_gpu(deployment, gpu, None)
    finals = [r.agents["final"] for r in rows if r.setting == 3]
    assert all(f.warmups > 0 and f.cached_tokens > 0 for f in finals)
    summary = json.loads((out / "summary.json").read_text())
    by_setting = {s["setting"]: s for s in summary["settings"]}
    assert set(by_setting) == {2, 3} and all(s["errors"] == 0 for s in by_setting.values())
    print(f"#3 / #2 latency, median: {by_setting[3]['latency_vs_2_median']:.3f}")
