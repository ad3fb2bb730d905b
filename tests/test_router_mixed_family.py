"""Two model families on real processes: conftest's SmolLM2 stack plus a Gemma-3-270M prefill +
decode pair behind its own sglang-router. A successor reads precursors of its own family as token
ids and the other family's as re-tokenized text (router/template.py's TextSplicer); greedy
pipelined must still equal blocking, token for token, on cold caches."""

from __future__ import annotations

import pytest
import requests

from router.cluster import ClusterSpec, Timeouts
from router.context import RouterContext
from router.orchestrator import Session
from tests.router_fixtures import tree_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma_stack(tmp_path_factory):
    """A Gemma-3-270M PD pair and its sglang-router (the model converts once, then is cached)."""
    import procs
    from conftest import PD_PAGE_SIZE, PD_TIMEOUT_S, WORKER_ARGS

    from sglang_ext.engine.model_store import resolve_model_path

    model_dir = resolve_model_path("gemma3-270m")
    log_dir = tmp_path_factory.mktemp("gemma-logs")
    env = {
        "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": str(PD_TIMEOUT_S),
        "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": str(PD_TIMEOUT_S),
    }
    args = WORKER_ARGS + ["--page-size", str(PD_PAGE_SIZE)]
    started = []
    try:
        prefill = procs.start_worker("gemma-prefill", model_dir, log_dir, "prefill", args, env)
        started.append(prefill)
        decode = procs.start_worker("gemma-decode", model_dir, log_dir, "decode", args, env)
        started.append(decode)
        procs.wait_healthy([prefill, decode])
        router = procs.start_router(prefill, decode, log_dir)
        started.append(router)
        procs.wait_healthy([router], timeout=60)
        procs.wait_router_ready(router)
        yield {"prefill": prefill, "decode": decode, "router": router, "model_dir": model_dir}
    finally:
        procs.stop_all(started)


def mixed_cluster(stack, gemma) -> ClusterSpec:
    def model(router, prefill, decode, path):
        return {
            "router_url": router.url,
            "prefill_urls": [prefill.url],
            "decode_urls": [decode.url],
            "bootstrap_ports": [prefill.bootstrap_port],
            "model_path": path,
            "tokenizer_path": path,
        }

    return ClusterSpec.model_validate(
        {
            "models": {
                "smollm2": model(stack.router, stack.prefill, stack.decode, stack.model_dir),
                "gemma3": model(
                    gemma["router"], gemma["prefill"], gemma["decode"], gemma["model_dir"]
                ),
            },
            "timeouts": Timeouts(read_s=60, warmup_s=60, precursor_wait_s=120).model_dump(),
        }
    )


def flush_all(stack, gemma) -> None:
    for proc in (stack.prefill, stack.decode, gemma["prefill"], gemma["decode"]):
        assert requests.post(proc.url + "/flush_cache", timeout=10).status_code == 200


async def test_mixed_family_pipelined_equals_blocking(stack, gemma_stack):
    """tree_9_3_1_mixed_cpu: a Gemma leaf under SmolLM2 aggregators (tree_3_1_mixed_cpu's only
    case), a Gemma aggregator over SmolLM2 leaves, and a SmolLM2 final over both families."""
    cfg = tree_config("tree_9_3_1_mixed_cpu", max_new_tokens=6)
    question = "Name a prime."
    models = {a.id: a.model for a in cfg.agents}
    async with RouterContext.open(mixed_cluster(stack, gemma_stack)) as ctx:
        assert ctx.tokenizer("gemma3").family != ctx.tokenizer("smollm2").family
        flush_all(stack, gemma_stack)  # cold caches, pipelined first (as test_router_engine)
        piped = await Session(ctx, cfg, question, "pipelined").run_all()
        orders = {a: t["slot_order"] for a, t in piped.trace.items() if t["slot_order"]}
        flush_all(stack, gemma_stack)
        blocked = await Session(ctx, cfg, question, "blocking", slot_orders=orders).run_all()
    for agent, t in piped.trace.items():
        b = blocked.trace[agent]
        assert t["output_ids"] and t["output_ids"] == b["output_ids"], (agent, models[agent])
        assert t["prompt_tokens"] == b["prompt_tokens"], agent
    # Both families served agents, and some successor read a precursor of the other family.
    assert {models[a] for a in piped.trace} == {"smollm2", "gemma3"}
    cross = [s for s in piped.trace if any(models[p] != models[s] for p in cfg.precursors(s))]
    assert cross
