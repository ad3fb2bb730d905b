"""An evaluation harness, unchanged, against the shell router: lm-eval's
`local-chat-completions` model with `--apply_chat_template` runs 3 questions of the vendored
GSM8K (experiments/lm_eval_tasks/gsm8k_local.yaml, no hub) through a real deployment and
scores them. The command is the README's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch.commands import make_stack

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def test_lm_eval_local_chat_completions_scores_three_questions(tmp_path):
    pytest.importorskip("lm_eval", reason="lm-eval comes with the test extras")
    raw = json.loads((ROOT / "cfgs" / "tree_3_1_cpu.json").read_text())
    raw["name"] = "tree_3_1_eval"
    for agent in raw["agents"]:  # short inner agents; lm-eval's max_tokens caps the final one
        agent["sampling"] = {"max_new_tokens": 8}
    config = tmp_path / "tree_3_1_eval.json"
    config.write_text(json.dumps(raw))
    with make_stack([str(config)], "torch", tmp_path / "dep", "127.0.0.1") as stack:
        url = stack.cluster()["shell_router_url"]
        out = tmp_path / "lm_eval_out"
        model_args = (
            f"model=tree_3_1_eval,base_url={url}/v1/chat/completions,"
            "num_concurrent=1,max_retries=1,tokenized_requests=False"
        )
        argv = [
            sys.executable,
            "-m",
            "lm_eval",
            "--model",
            "local-chat-completions",
            "--model_args",
            model_args,
            "--include_path",
            "experiments/lm_eval_tasks",
            "--tasks",
            "gsm8k_local",
            "--apply_chat_template",
            "--limit",
            "3",
            "--gen_kwargs",
            "max_gen_toks=16",
            "--output_path",
            str(out),
        ]
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1",
        }
        proc = subprocess.run(
            argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(next(out.rglob("results_*.json")).read_text())
    task = results["results"]["gsm8k_local"]
    score = task["exact_match,flexible-extract"]
    assert 0.0 <= score <= 1.0
    assert results["n-samples"]["gsm8k_local"]["effective"] == 3
