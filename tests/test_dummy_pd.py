"""A weight-free deployment on the reference engine, as `moa-pd up --config tree_3_1_dummy_cpu`
starts it: a 2-layer Qwen3 shape ('dummy:qwen3-tiny', load_format dummy) in a PD pair behind the
real sglang-router. The pair computes with the same seeded random weights as a plain worker of
the same model (greedy ids through the router equal that worker's), ignore_eos answers have
exactly max_new_tokens tokens, and the shell router keeps pipelined == blocking -- the path the
GPU configs (tree_9_3_1_dummy_gpu and friends) take on real SGLang."""

from __future__ import annotations

import random

import procs
import pytest
import requests
from sglang_real import deployment_cluster, pipelined_and_blocked

from launch.commands import make_stack
from launch.procs import wait_routable
from router.config_loader import load_config
from router.context import RouterContext
from sglang_ext import protocol as P

pytestmark = pytest.mark.slow
CONFIG = "tree_3_1_dummy_cpu"
MODEL = "qwen3-tiny"


@pytest.fixture(scope="module")
def dummy_up(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dummy-up")
    stack = make_stack([CONFIG], "torch", tmp / "run", "127.0.0.1")
    single = None
    try:
        cluster = stack.up()
        router = next(p for p in stack.procs if p.spec.name == f"{MODEL}.router")
        wait_routable(cluster["models"][MODEL]["router_url"], 120, router)
        # The reference: one plain worker of the same model and load format.
        single = procs.start_worker(
            "single",
            cluster["models"][MODEL]["model_path"],
            tmp / "logs",
            "null",
            ["--load-format", "dummy"],
        )
        procs.wait_healthy([single])
        yield stack, cluster, single
    finally:
        if single is not None:
            procs.stop_all([single])
        stack.down()


def generate(url: str, ids: list[int], n: int) -> dict:
    body = {
        P.INPUT_IDS: ids,
        P.SAMPLING_PARAMS: {P.MAX_NEW_TOKENS: n, P.TEMPERATURE: 0, P.IGNORE_EOS: True},
    }
    r = requests.post(url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_workers_load_dummy_weights(dummy_up):
    stack, _, _ = dummy_up
    for proc in stack.procs:
        if proc.spec.name in (f"{MODEL}.prefill0", f"{MODEL}.decode0"):
            argv = proc.spec.argv
            assert argv[argv.index("--load-format") + 1] == "dummy"
            assert argv[argv.index("--model-path") + 1].endswith("dummy-qwen3-tiny")


def test_pd_pair_equals_a_single_worker_with_exact_lengths(dummy_up):
    _, cluster, single = dummy_up
    rng = random.Random(5)
    for n_prompt, n_out in ((7, 24), (40, 9)):
        ids = [rng.randrange(100, 40000) for _ in range(n_prompt)]
        ref = generate(single.url, ids, n_out)
        got = generate(cluster["models"][MODEL]["router_url"], ids, n_out)
        assert len(got[P.OUTPUT_IDS]) == len(ref[P.OUTPUT_IDS]) == n_out
        assert got[P.OUTPUT_IDS] == ref[P.OUTPUT_IDS]
        assert got[P.META_INFO][P.COMPLETION_TOKENS] == n_out


async def test_pipelined_equals_blocking_on_the_dummy_tree(dummy_up):
    _, cluster, _ = dummy_up
    spec = deployment_cluster(cluster)
    workers = [*spec.models[MODEL].prefill_urls, *spec.models[MODEL].decode_urls]
    cfg = load_config(CONFIG)  # its own fixed lengths: 12/20/28 tokens, the aggregator 16
    async with RouterContext.open(spec) as ctx:
        piped, blocked = await pipelined_and_blocked(ctx, cfg, "What is 7 times 8?", workers)
    for agent, t in piped.trace.items():
        assert t["output_ids"] and t["output_ids"] == blocked.trace[agent]["output_ids"], agent
        assert t["prompt_tokens"] == blocked.trace[agent]["prompt_tokens"]
        assert len(t["output_ids"]) == cfg.sampling_of(agent).max_new_tokens
