"""`python -m benchmarks.microbench --backend sglang` on GPUs (marker `gpu`, issue 12 item 5: the
validation must run the microbench on SGLang, not only on the reference engine). A module of its
own, so the PD pair of tests/test_sglang_gpu.py has given its GPUs back before this one starts
workers on them. The same command and checks as tests/test_sglang_cpu_microbench.py, which runs
them on SGLang's CPU path in CI; here the workers run on the GPUs the launcher places them on --
with one GPU, both on it (issue 19) -- with MOA_PD_GPU_MODEL's weights or, by default, the
Qwen3-8B shape with random weights ('dummy:qwen3-8b', which the microbench loads with
--load-format dummy)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_sglang_gpu import attention, gpu_model, gpus, sglang_case  # noqa: F401 (fixtures)

from benchmarks.microbench import sample_prompts, warm_prefix_lengths
from benchmarks.microbench_deploy import vocab_size
from launch.ports import port_in_use
from sglang_ext.sglang_backend import gpu as sglang_gpu

pytestmark = pytest.mark.gpu

MAX_LEN, CHUNK, SEED, PROMPTS = 2048, 256, 0, 4


def test_microbench_on_sglang_gpus_hits_its_warmups(gpus, gpu_model, attention, tmp_path):  # noqa: F811
    variants = "incremental,pd"
    model_dir, load_format = gpu_model
    out = tmp_path / "mb"
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.microbench",
        "--backend",
        "sglang",
        "--model-path",
        model_dir,
        "--out",
        str(out),
        "--num-prompts",
        str(PROMPTS),
        "--max-len",
        str(MAX_LEN),
        "--output-len",
        "8",
        "--warm-chunk",
        str(CHUNK),
        "--seed",
        str(SEED),
        "--variants",
        variants,
        "--load-format",
        load_format,
    ]
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "microbench.jsonl").open()]
    prompts = sample_prompts(PROMPTS, MAX_LEN, vocab_size(model_dir), SEED)
    by_variant: dict[str, list[dict]] = {}
    for row in rows:
        by_variant.setdefault(row["variant"], []).append(row)
    assert set(by_variant) == set(variants.split(","))
    assert len(by_variant["incremental"]) == PROMPTS
    for row in by_variant["incremental"]:
        warmed = warm_prefix_lengths(len(prompts[row["prompt_index"]]), CHUNK)
        assert row["cached_tokens"] == (warmed[-1] if warmed else 0), row
    assert all(row["cached_tokens"] == 0 for row in by_variant["pd"])  # flushed between variants
    assert (out / "fig_microbench.png").exists()
    argvs = {
        role: (out / "logs" / f"pd.{role}.log").read_text().splitlines()[0].split()
        for role in ("prefill", "decode")
    }
    for argv in argvs.values():
        assert argv[argv.index("--backend") + 1] == "sglang" and "--base-gpu-id" in argv
        if sglang_gpu.has_fa3():  # SGLang's own default on Hopper
            assert "--attention-backend" not in argv
        else:
            assert argv[argv.index("--attention-backend") + 1] == "triton"
        if load_format == "dummy":
            assert argv[argv.index("--load-format") + 1] == "dummy"
        assert not port_in_use(int(argv[argv.index("--port") + 1])), "a worker outlived the run"
    if gpus == 1:  # the PD pair shares the one GPU
        assert {argv[argv.index("--base-gpu-id") + 1] for argv in argvs.values()} == {"0"}
    print(f"microbench on {gpus} GPU(s), attention {sglang_gpu.attention_backend()}")
