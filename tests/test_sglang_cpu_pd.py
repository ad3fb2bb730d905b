"""`moa-pd up --backend sglang` on a machine without a GPU (launch.commands.make_stack): a real PD
pair on SGLang's CPU path -- prefill + decode through our patched launcher, KV over NIXL/UCX on
host memory -- behind the real sglang-router, plus the shell router; the workers run with
`--enable-priority-scheduling` (a copy of tree_3_1_cpu asks for it). Greedy ids through the router
equal the reference engine's (test_sglang_cpu_single shows the single SGLang server's do too);
warm-ups formed by the router are hit by the final request through the router; and the shell
router keeps its invariant, pipelined == blocking for every agent, on tree_3_1_cpu with the
`priority` field on every request. Run by `make test-sglang`."""

from __future__ import annotations

import json
import uuid

import pytest
from router_fixtures import tree_config
from sglang_real import (
    QUESTION,
    SYSTEM,
    deployment_cluster,
    flush,
    greedy,
    needs_sglang,
    reference_prompts,
    router_warmup,
    tokenize,
)

from launch.commands import make_stack
from launch.procs import wait_routable
from router.config_loader import resolve_config_path
from router.context import RouterContext
from router.orchestrator import Session
from sglang_ext import protocol as P

pytestmark = pytest.mark.sglang_cpu
needs_sglang()


@pytest.fixture(scope="module")
def sglang_pd(sglang_nulls, tmp_path_factory):
    """What `moa-pd up --backend sglang --config <tree_3_1_cpu + priority>` starts, once for the
    module; the session's plain servers stop first (memory: two SGLang servers at a time)."""
    sglang_nulls.release()
    tmp = tmp_path_factory.mktemp("sglang-up")
    cfg = json.loads(resolve_config_path("tree_3_1_cpu").read_text())
    cfg["name"] = "tree_3_1_cpu_priority"
    cfg["models"]["smollm2"]["server_args"]["sglang"] = {"enable_priority_scheduling": True}
    path = tmp / "tree_3_1_cpu_priority.json"
    path.write_text(json.dumps(cfg))
    stack = make_stack([str(path)], "sglang", tmp / "run", "127.0.0.1")
    assert stack.sglang_cpu
    try:
        cluster = stack.up()
        router = next(p for p in stack.procs if p.spec.name == "smollm2.router")
        wait_routable(cluster["models"]["smollm2"]["router_url"], 120, router)
        yield stack, cluster
    finally:
        stack.down()


def test_greedy_through_the_router_equals_the_reference_engine(
    sglang_pd, sglang_nulls, smollm2_dir
):
    stack, cluster = sglang_pd
    logs = {p.spec.name: p.log_path.read_text(errors="replace") for p in stack.procs}
    for role in ("prefill0", "decode0"):
        assert "moa-pd patch warmup_radix_insert applied" in logs[f"smollm2.{role}"]
        assert "NIXL registers the KV pool as DRAM" in logs[f"smollm2.{role}"]
    router = cluster["models"]["smollm2"]["router_url"]
    got = [
        greedy(router, ids, priority=P.PRIORITY_CRITICAL)[P.OUTPUT_IDS]
        for ids in reference_prompts(smollm2_dir)
    ]
    assert got == sglang_nulls.reference_ids()


@pytest.mark.parametrize("verb", ["generate", "prefill_only"])
def test_warmup_on_the_prefill_is_hit_through_the_router(sglang_pd, smollm2_dir, verb):
    _, cluster = sglang_pd
    system = SYSTEM.replace("careful", f"careful ({uuid.uuid4().hex[:8]})")
    prefix = tokenize(smollm2_dir, system)
    spec = deployment_cluster(cluster, warmup_verb=verb, priority_scheduling=True)
    meta = router_warmup(spec, prefix, uuid.uuid4().hex)
    assert meta[P.PROMPT_TOKENS] == len(prefix)
    out = greedy(
        cluster["models"]["smollm2"]["router_url"],
        prefix + tokenize(smollm2_dir, QUESTION),
        priority=P.PRIORITY_CRITICAL,
    )
    assert out[P.META_INFO][P.CACHED_TOKENS] == len(prefix)


async def test_shell_router_pipelined_equals_blocking_with_priority(sglang_pd):
    _, cluster = sglang_pd
    spec = deployment_cluster(cluster, priority_scheduling=True)
    m = spec.models["smollm2"]
    workers = [*m.prefill_urls, *m.decode_urls]
    cfg = tree_config("tree_3_1_cpu", max_new_tokens=8)

    async with RouterContext.open(spec) as ctx:
        question = "What is 7 times 8?"
        flush(*workers)  # cold caches, pipelined first: a wrong warm-up KV cannot hide
        piped = await Session(ctx, cfg, question, "pipelined").run_all()
        orders = {a: t["slot_order"] for a, t in piped.trace.items() if t["slot_order"]}
        flush(*workers)
        blocked = await Session(ctx, cfg, question, "blocking", slot_orders=orders).run_all()
    for agent, t in piped.trace.items():
        b = blocked.trace[agent]
        assert t["output_ids"] and t["output_ids"] == b["output_ids"], agent
        assert t["prompt_tokens"] == b["prompt_tokens"]
    succ = [t for t in piped.trace.values() if t["slot_order"]]
    assert all(t["cached_tokens"] > 0 for t in succ if t["warmups"])
