"""The shell router on real processes (conftest's stack: SmolLM2-135M prefill + decode over NIXL
behind the real sglang-router): THE invariant, greedy pipelined == blocking (== blocking by
layer) for every agent;
stickiness with a second prefill worker; aborts leave nothing on the workers."""

from __future__ import annotations

import asyncio
import time

import pytest
import requests

from router.cluster import ClusterSpec
from router.context import RouterContext
from router.orchestrator import Session
from tests.router_fixtures import stack_cluster, tree_config

pytestmark = pytest.mark.slow

QUESTIONS = ("What is 7 times 8?", "Name the largest planet.")


def live_reqs(url: str) -> int:
    return requests.get(url + "/get_server_info", timeout=10).json()["kv_pool"]["num_live_reqs"]


def wait_idle(urls: list[str], timeout: float = 20) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        live = {u: live_reqs(u) for u in urls}
        if not any(live.values()) or time.monotonic() > deadline:
            return live
        time.sleep(0.2)


def flush(stack) -> None:
    for url in (stack.prefill.url, stack.decode.url):
        assert requests.post(url + "/flush_cache", timeout=10).status_code == 200


# Kept small: the 2-core CI box decodes SmolLM2 at a few tokens/s per stream under load.
@pytest.mark.parametrize(
    "tree,slot_order,n_tokens,questions,temperature",
    [
        ("tree_3_1_cpu", "template", 8, QUESTIONS, 0.0),
        ("tree_3_1_cpu", "dynamic", 8, QUESTIONS[1:], 0.0),
        ("tree_9_3_1_cpu", "template", 10, QUESTIONS[:1], 0.0),
        ("tree_9_3_1_cpu", "dynamic", 10, QUESTIONS[1:], 0.0),
        # Seeded sampling: each agent its own sampling_seed, temperature 0.8.
        ("tree_3_1_cpu", "template", 8, QUESTIONS[:1], 0.8),
    ],
)
async def test_pipelined_equals_blocking_on_the_engine(
    stack, tree, slot_order, n_tokens, questions, temperature
):
    cfg = tree_config(tree, max_new_tokens=n_tokens, slot_order=slot_order, temperature=temperature)
    async with RouterContext.open(stack_cluster(stack)) as ctx:
        for q in questions:
            # Cold caches, pipelined first: a wrong warm-up KV cannot hide behind blocking's
            # fresh computation of the same prefix.
            flush(stack)
            piped = await Session(ctx, cfg, q, "pipelined").run_all()
            orders = {a: t["slot_order"] for a, t in piped.trace.items() if t["slot_order"]}
            # The layer barrier (the paper's baseline) matters only where layers have clusters;
            # it builds prompts as blocking does, so one slot order of the 9-3-1 tree checks it.
            layered = tree == "tree_9_3_1_cpu" and slot_order == "template"
            modes = ("blocking", "blocking_layer") if layered else ("blocking",)
            for mode in modes:
                flush(stack)
                blocked = await Session(ctx, cfg, q, mode, slot_orders=orders).run_all()
                for agent, t in piped.trace.items():
                    b = blocked.trace[agent]
                    assert t["output_ids"] and t["output_ids"] == b["output_ids"], (q, mode, agent)
                    assert t["slot_order"] == b["slot_order"]
                    assert t["prompt_tokens"] == b["prompt_tokens"]
            # A successor whose precursors all ended before the gate opened sends no warm-up
            # (its final request supersedes them); those that were warmed hit their warm-ups.
            succ = [t for t in piped.trace.values() if t["slot_order"]]
            assert any(t["warmups"] for t in succ)
            assert all(t["cached_tokens"] > 0 for t in succ if t["warmups"])
    assert wait_idle([stack.prefill.url, stack.decode.url]) == {
        stack.prefill.url: 0,
        stack.decode.url: 0,
    }


async def test_a_shared_device_measures_what_warmups_cost_and_answers_stay_exact(stack):
    """The CPU default's device gate (issue 28): the prefill and decode workers on one device of
    two slots, warm-ups weighed against the slowdown the router measures from the decode
    chunks. A 9-3-1 and a 3-1 question at once (12 leaves: within the stack's 16 running
    requests): the device's meter compared decode steps with and without warm-ups, and every
    agent's tokens equal blocking's."""
    runs = [
        (tree_config("tree_9_3_1_cpu", max_new_tokens=32), QUESTIONS[0]),
        (tree_config("tree_3_1_cpu", max_new_tokens=32), QUESTIONS[1]),
    ]
    spec = stack_cluster(stack).model_dump()
    spec["devices"] = {"cpu": 2}
    spec["models"]["smollm2"].update(prefill_devices=["cpu"], decode_devices=["cpu"])
    flush(stack)
    async with RouterContext.open(ClusterSpec.model_validate(spec)) as ctx:
        piped = await asyncio.gather(
            *(Session(ctx, cfg, q, "pipelined").run_all() for cfg, q in runs)
        )
        meter = ctx.devices["cpu"].slowdown
        assert meter.segments >= 1, "no segment compared decode steps with and without warm-ups"
        assert sum(t["warmups"] for p in piped for t in p.trace.values()) >= 2
        for (cfg, q), p in zip(runs, piped):
            orders = {a: t["slot_order"] for a, t in p.trace.items() if t["slot_order"]}
            blocked = await Session(ctx, cfg, q, "blocking", slot_orders=orders).run_all()
            for agent, t in p.trace.items():
                assert t["output_ids"] == blocked.trace[agent]["output_ids"], (q, agent)


@pytest.fixture(scope="module")
def second_prefill(stack, tmp_path_factory):
    """One more prefill worker for the same model (the stack's decode pairs with either)."""
    import procs
    from conftest import PD_PAGE_SIZE, WORKER_ARGS

    log_dir = tmp_path_factory.mktemp("prefill2-logs")
    p = procs.start_worker(
        "prefill2",
        stack.model_dir,
        log_dir,
        "prefill",
        WORKER_ARGS + ["--page-size", str(PD_PAGE_SIZE)],
    )
    try:
        procs.wait_healthy([p])
        yield p
    finally:
        procs.stop(p)


async def test_each_successor_sticks_to_one_of_two_prefill_workers(stack, second_prefill):
    from conftest import PD_PAGE_SIZE

    cfg = tree_config("tree_3_1_cpu", max_new_tokens=4)
    used = []
    async with RouterContext.open(stack_cluster(stack, [second_prefill])) as ctx:
        for q in QUESTIONS:
            trace = (await Session(ctx, cfg, q, "pipelined").run_all()).trace
            used += [a["prefill_replica"] for a in trace.values()]
            t = trace["final"]
            # The final request hit what its warm-ups left, so it reached their worker (only
            # whole pages are cached), though the other worker served requests too.
            warmed = t["warmup_lengths"][-1] // PD_PAGE_SIZE * PD_PAGE_SIZE
            assert t["cached_tokens"] >= warmed, t
    assert set(used) == {0, 1}  # the requests spread over both workers, by load


async def test_cancelled_question_leaves_no_requests(stack):
    cfg = tree_config("tree_3_1_cpu", max_new_tokens=200)
    async with RouterContext.open(stack_cluster(stack)) as ctx:
        session = Session(ctx, cfg, QUESTIONS[0], "pipelined")
        task = asyncio.create_task(session.run_all())
        for _ in range(200):
            await asyncio.sleep(0.05)
            if all(len(session.apc[a].output_ids) > 2 for a in ("leaf_0_0", "leaf_0_1")):
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert all(t["killed"] for t in session.trace().values())
    assert wait_idle([stack.prefill.url, stack.decode.url]) == {
        stack.prefill.url: 0,
        stack.decode.url: 0,
    }


async def test_no_warmup_starts_while_a_critical_prefill_is_outstanding(stack):
    """The PrefillGate on real processes: every warm-up of a 9-3-1 question was sent outside
    every critical prefill on the (one) prefill worker: a leaf's request until its first token,
    a successor's final request until its prefill reply or first token. Without the gate the
    static prefixes go out at once, while the leaves' prompts are still being prefilled."""
    cfg = tree_config("tree_9_3_1_cpu", max_new_tokens=12)
    flush(stack)
    async with RouterContext.open(stack_cluster(stack)) as ctx:
        trace = (await Session(ctx, cfg, QUESTIONS[0], "pipelined").run_all()).trace
    critical = []
    for t in trace.values():
        ends = [x for x in (t["prefill_reply_s"], t["first_token_s"]) if x is not None]
        critical.append((t["final_request_s"], min(ends)))
    warmups = [span[0] for t in trace.values() for span in t["warmup_spans"]]
    assert len(warmups) >= 4  # every successor's static prefix, and more
    for sent in warmups:
        inside = [(a, b) for a, b in critical if a < sent < b]
        assert not inside, f"warm-up sent at {sent:.3f}s during critical prefill(s) {inside}"
    # The leaves' prompts went first: no warm-up before the last leaf's prefill was over (its
    # prefill worker's reply, or its first token if that came first).
    leaves = [c for c, t in zip(critical, trace.values()) if not t["slot_order"]]
    assert min(warmups) >= max(end for _, end in leaves)
