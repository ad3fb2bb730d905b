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
import time
import uuid

import pytest
import requests
from router_fixtures import tree_config
from sglang_real import (
    CHAT,
    QUESTION,
    SYSTEM,
    deployment_cluster,
    flush,
    greedy,
    needs_sglang,
    reference_outputs,
    router_warmup,
    tokenize,
)

from launch.commands import make_stack
from router.config_loader import resolve_config_path
from router.context import RouterContext
from router.orchestrator import Session
from sglang_ext import protocol as P

pytestmark = pytest.mark.sglang_cpu
needs_sglang()


def wait_router_ready(url: str, timeout: float = 120) -> None:
    """The sglang-router registers its workers in the background: wait until a generate passes."""
    deadline, last = time.monotonic() + timeout, ""
    body = {P.INPUT_IDS: [1, 2, 3], P.SAMPLING_PARAMS: {P.MAX_NEW_TOKENS: 1, P.TEMPERATURE: 0}}
    while time.monotonic() < deadline:
        try:
            r = requests.post(url + "/generate", json=body, timeout=60)
            if r.status_code == 200:
                return
            last = f"{r.status_code} {r.text[:200]}"
        except requests.RequestException as e:
            last = repr(e)
        time.sleep(0.5)
    raise TimeoutError(f"router {url} not ready after {timeout}s: {last}")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """What `moa-pd up --backend sglang --config <tree_3_1_cpu + priority>` starts."""
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
        wait_router_ready(cluster["models"]["smollm2"]["router_url"])
        yield stack, cluster
    finally:
        stack.down()


def test_greedy_through_the_router_equals_the_reference_engine(deployment, smollm2_dir, tmp_path):
    stack, cluster = deployment
    logs = {p.spec.name: p.log_path.read_text(errors="replace") for p in stack.procs}
    for role in ("prefill0", "decode0"):
        assert "moa-pd patch warmup_radix_insert applied" in logs[f"smollm2.{role}"]
        assert "NIXL registers the KV pool as DRAM" in logs[f"smollm2.{role}"]
    router = cluster["models"]["smollm2"]["router_url"]
    prompts = [tokenize(smollm2_dir, CHAT), tokenize(smollm2_dir, SYSTEM + QUESTION)]
    got = [greedy(router, ids, priority=P.PRIORITY_CRITICAL)[P.OUTPUT_IDS] for ids in prompts]
    assert got == reference_outputs(smollm2_dir, prompts, tmp_path)


@pytest.mark.parametrize("verb", ["generate", "prefill_only"])
def test_warmup_on_the_prefill_is_hit_through_the_router(deployment, smollm2_dir, verb):
    _, cluster = deployment
    system = SYSTEM.replace("careful", f"careful ({uuid.uuid4().hex[:8]})")
    prefix = tokenize(smollm2_dir, system)
    spec = deployment_cluster(cluster, warmup_verb=verb, priority_scheduling=True)
    meta = router_warmup(spec, prefix, uuid.uuid4().hex)
    assert meta[P.PROMPT_TOKENS] == len(prefix)
    out = greedy(cluster["models"]["smollm2"]["router_url"],
                 prefix + tokenize(smollm2_dir, QUESTION), priority=P.PRIORITY_CRITICAL)
    assert out[P.META_INFO][P.CACHED_TOKENS] == len(prefix)


async def test_shell_router_pipelined_equals_blocking_with_priority(deployment):
    _, cluster = deployment
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
