"""`python -m benchmarks.microbench --backend sglang` on real SGLang's CPU path (marker
`sglang_cpu`, run by `make test-sglang`): the command starts a PD pair of real SGLang workers
behind the sglang-router with the CPU flags `moa-pd up --backend sglang` uses, and its incremental
variant's warm-ups are hit by the final request. Kept small: one prompt, two output tokens, two
variants."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sglang_real import needs_sglang

from benchmarks.microbench import sample_prompts, warm_prefix_lengths
from launch.ports import port_in_use

pytestmark = pytest.mark.sglang_cpu

MAX_LEN, CHUNK, SEED = 160, 32, 0  # a 99-token prompt: warm-ups of 32, 64, 96 tokens


def test_microbench_on_sglang_cpu_hits_its_warmups(tmp_path):
    needs_sglang()
    from benchmarks.microbench_deploy import vocab_size

    prompt = sample_prompts(1, MAX_LEN, vocab_size("smollm2-135m"), SEED)[0]
    warmed = warm_prefix_lengths(len(prompt), CHUNK)
    assert warmed, "pick a seed whose prompt is longer than one warm-up chunk"
    out = tmp_path / "mb"
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.microbench",
        "--backend",
        "sglang",
        "--out",
        str(out),
        "--num-prompts",
        "1",
        "--max-len",
        str(MAX_LEN),
        "--output-len",
        "2",
        "--warm-chunk",
        str(CHUNK),
        "--seed",
        str(SEED),
    ]
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=480)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    rows = {row["variant"]: row for row in map(json.loads, (out / "microbench.jsonl").open())}
    assert set(rows) == {"incremental", "pd"}  # the CPU default: one PD pair only
    assert rows["incremental"]["cached_tokens"] == warmed[-1]
    assert rows["pd"]["cached_tokens"] == 0  # caches flushed between variants
    assert (out / "fig_microbench.png").exists()
    prefill_log = (out / "logs" / "pd.prefill.log").read_text()
    argv = prefill_log.splitlines()[0].split()
    assert argv[argv.index("--backend") + 1] == "sglang" and "--device" in argv
    assert "moa-pd patch" in prefill_log  # the patched launcher served it
    port = int(argv[argv.index("--port") + 1])
    assert not port_in_use(port), "the prefill worker outlived the command"
