"""Shared pieces of the tests on real SGLang's CPU path (marker `sglang_cpu`, `make test-sglang`):
prompts, greedy reference outputs from the reference engine, a warm-up formed by the router's own
code, and one-model cluster specs. Every SGLang server is started once per module (≈20-30 s and
≈3.7 GB each), one stack at a time."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import procs
import pytest
import requests

from router.cluster import ClusterSpec, Timeouts
from router.context import RouterContext
from sglang_ext import protocol as P

# SmolLM2 chat prompts; the second is long enough that a warm-up of its system turn matters.
CHAT = (
    "<|im_start|>user\nWrite one short sentence about the sea.<|im_end|>\n<|im_start|>assistant\n"
)
SYSTEM = (
    "<|im_start|>system\nYou are a careful problem solver. Work through the problem step by step, "
    "check each step, and finish with the final answer stated plainly. Keep the answer short and "
    "name the unit of every number you give.<|im_end|>\n"
)
QUESTION = "<|im_start|>user\nWhat is 7 times 8?<|im_end|>\n<|im_start|>assistant\n"
N_TOKENS = 8


def needs_sglang() -> None:
    """Skip, with the fix, where real SGLang is not installed (the project's own .venv)."""
    pytest.importorskip("sglang", reason="real SGLang is not installed here: run `make test-sglang`")


def tokenize(model_dir: str, text: str) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir).encode(text, add_special_tokens=False)


def greedy(url: str, input_ids: list[int], n: int = N_TOKENS, **body) -> dict:
    r = requests.post(
        url + "/generate",
        json={
            P.INPUT_IDS: input_ids,
            P.SAMPLING_PARAMS: {P.MAX_NEW_TOKENS: n, P.TEMPERATURE: 0, P.IGNORE_EOS: True},
            **body,
        },
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()


def reference_outputs(model_dir: str, prompts: list[list[int]], log_dir: Path) -> list[list[int]]:
    """Greedy ids of the reference engine (`--backend torch`) for each prompt."""
    ref = procs.start_worker("reference", model_dir, log_dir, "null")
    try:
        procs.wait_healthy([ref])
        return [greedy(ref.url, ids)[P.OUTPUT_IDS] for ids in prompts]
    finally:
        procs.stop_all([ref])


def cluster(router_url: str, prefill: procs.Proc, decode_url: str, model_dir: str,
            **kw) -> ClusterSpec:
    return ClusterSpec.model_validate(
        {
            "models": {
                "smollm2": {
                    "router_url": router_url,
                    "prefill_urls": [prefill.url],
                    "decode_urls": [decode_url],
                    "bootstrap_ports": [prefill.bootstrap_port or procs.free_port()],
                    "model_path": model_dir,
                    "tokenizer_path": model_dir,
                }
            },
            "timeouts": Timeouts(read_s=120, warmup_s=120, precursor_wait_s=180).model_dump(),
            **kw,
        }
    )


def deployment_cluster(cluster: dict, **kw) -> ClusterSpec:
    """The ClusterSpec of a `moa-pd up` deployment (its cluster.json), with test timeouts."""
    timeouts = Timeouts(read_s=120, warmup_s=120, precursor_wait_s=180).model_dump()
    return ClusterSpec.model_validate({**cluster, "timeouts": timeouts, **kw})


def router_warmup(spec: ClusterSpec, input_ids: list[int], rid: str) -> dict:
    """A warm-up sent by the router's own code (router/pd.py::Deployment.warmup); its meta_info."""

    async def send() -> dict:
        async with RouterContext.open(spec) as ctx:
            dep = ctx.deployments["smollm2"]
            target = dep.pick_prefill()
            try:
                return await dep.warmup(target, input_ids, P.WARMUP_RID_PREFIX + rid)
            finally:
                dep.unpin(target)

    return asyncio.run(send())


def flush(*urls: str, timeout_s: float = 60) -> None:
    """Flush each worker's radix cache. SGLang refuses (400) while a request is still live -- a
    PD worker holds one until its KV transfer is acknowledged -- so retry until it agrees."""
    for url in urls:
        deadline = time.monotonic() + timeout_s
        while (r := requests.post(url + "/flush_cache", timeout=30)).status_code != 200:
            assert time.monotonic() < deadline, f"{url}/flush_cache: {r.status_code} {r.text}"
            time.sleep(0.2)
