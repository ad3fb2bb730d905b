"""Running question graphs on fake PD workers: the blocking/pipelined invariant, stickiness,
failures named by precursor, timeouts, aborts, memory over many questions."""

from __future__ import annotations

import asyncio
import gc
import resource

import pytest

from router.cluster import Timeouts
from router.context import ConfigNotServed, RouterContext
from router.orchestrator import AgentFailed, Session
from tests.router_fixtures import (  # noqa: F401
    smollm_tokenizer_path,
    start_fake_cluster,
    tree_config,
)

FAST = {"decode": {"token_delay_s": 0.002}, "router": {"token_delay_s": 0.002}}


async def run(ctx, cfg, mode, question="What is 2+3?", **kw):
    return await Session(ctx, cfg, question, mode, **kw).run_all()


@pytest.mark.parametrize("tree", ["tree_3_1_cpu", "tree_9_3_1_cpu"])
@pytest.mark.parametrize("slot_order", ["template", "dynamic"])
async def test_pipelined_and_blocking_give_identical_tokens(
    smollm_tokenizer_path,  # noqa: F811
    tree,
    slot_order,
):
    cluster = await start_fake_cluster(smollm_tokenizer_path, **FAST)
    cfg = tree_config(tree, max_new_tokens=12, slot_order=slot_order)
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            for q in ("What is 2+3?", "Name a prime above 10."):
                piped = await run(ctx, cfg, "pipelined", q)
                orders = {a: t["slot_order"] for a, t in piped.trace.items() if t["slot_order"]}
                blocked = await run(ctx, cfg, "blocking", q, slot_orders=orders)
                for agent, t in piped.trace.items():
                    assert t["output_ids"] == blocked.trace[agent]["output_ids"], agent
                    assert t["slot_order"] == blocked.trace[agent]["slot_order"]
                assert piped.answer == blocked.answer
                succ = [t for t in piped.trace.values() if t["slot_order"]]
                assert all(t["warmups"] >= 1 for t in succ)
                assert all(t["warmups"] == 0 for t in blocked.trace.values())
                # The final request found everything warmed in the prefill worker's cache.
                assert all(t["cached_tokens"] >= t["warmup_lengths"][-1] for t in succ)
        finals = [r for r in cluster.prefills[0].finals()]
        assert finals and all(r["bootstrap_room"] is not None for r in finals)
    finally:
        await cluster.close()


async def test_successors_stick_to_one_prefill_worker(smollm_tokenizer_path):  # noqa: F811
    cluster = await start_fake_cluster(smollm_tokenizer_path, n_prefill=2, n_decode=2, **FAST)
    cfg = tree_config("tree_9_3_1_cpu", max_new_tokens=10)
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            result = await run(ctx, cfg, "pipelined")
        used = set()
        for agent, t in result.trace.items():
            if not t["slot_order"]:
                continue
            worker = next(w for w in cluster.prefills if w.url == t["prefill_url"])
            other = next(w for w in cluster.prefills if w is not worker)
            mine = [r for r in worker.requests if f"-{agent}-" in r["rid"]]
            assert len(mine) == t["warmups"] + 1  # every warm-up and the final request
            assert not [r for r in other.requests if f"-{agent}-" in r["rid"]]
            used.add(worker.url)
        assert len(used) == 2  # four successors spread over both workers
        assert all(d.finals() for d in cluster.decodes)
    finally:
        await cluster.close()


async def test_a_failing_precursor_is_named(smollm_tokenizer_path):  # noqa: F811
    cluster = await start_fake_cluster(
        smollm_tokenizer_path, router={"fail_rids_containing": "leaf_0_1"}
    )
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            with pytest.raises(AgentFailed) as e:
                await run(ctx, tree_config(), "pipelined")
        msg = str(e.value)
        assert "precursor 'leaf_0_1' failed" in msg and "HTTP 500" in msg
        assert cluster.router.url in msg
    finally:
        await cluster.close()


async def test_a_hanging_worker_times_out_and_is_aborted(smollm_tokenizer_path):  # noqa: F811
    cluster = await start_fake_cluster(
        smollm_tokenizer_path, timeouts=Timeouts(read_s=0.3), decode={"hang": True}
    )
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            with pytest.raises(AgentFailed, match=r"decode request to .* no data for 0.3s"):
                await asyncio.wait_for(run(ctx, tree_config(), "blocking"), 10)
        await asyncio.sleep(0.05)
        assert not cluster.decodes[0].active  # the abort released it
        assert cluster.decodes[0].aborted
    finally:
        await cluster.close()


async def test_a_worker_that_is_down(smollm_tokenizer_path):  # noqa: F811
    cluster = await start_fake_cluster(smollm_tokenizer_path)
    await cluster.router.server.close()
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            with pytest.raises(AgentFailed, match="router request to .* cannot connect"):
                await run(ctx, tree_config(), "pipelined")
    finally:
        await cluster.close()


async def test_a_model_not_served(smollm_tokenizer_path):  # noqa: F811
    cluster = await start_fake_cluster(smollm_tokenizer_path, model="other")
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            with pytest.raises(ConfigNotServed, match="smollm2"):
                Session(ctx, tree_config(), "q", "pipelined")
    finally:
        await cluster.close()


async def test_cancelling_a_question_leaves_no_requests_on_workers(smollm_tokenizer_path):  # noqa: F811
    slow = {"decode": {"token_delay_s": 0.05}, "router": {"token_delay_s": 0.05}}
    cluster = await start_fake_cluster(smollm_tokenizer_path, **slow)
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            session = Session(ctx, tree_config(max_new_tokens=200), "q", "pipelined")
            task = asyncio.create_task(session.run_all())
            for _ in range(100):
                if len(cluster.router.active) == 3 and cluster.prefills[0].warmups():
                    break
                await asyncio.sleep(0.05)
            assert cluster.router.active
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.05)
            assert all(t["killed"] for t in session.trace().values())
        for w in cluster.workers():
            assert not w.active, w.role
        # sglang-router has no abort verb: every worker of the model is told each rid.
        leaf_rids = {r["rid"] for r in cluster.router.requests}
        assert leaf_rids <= set(cluster.decodes[0].aborted)
        assert leaf_rids <= set(cluster.prefills[0].aborted)
    finally:
        await cluster.close()


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def test_memory_stays_flat_over_1000_questions(smollm_tokenizer_path):  # noqa: F811
    cluster = await start_fake_cluster(smollm_tokenizer_path)
    cfg = tree_config(max_new_tokens=4)
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            for i in range(150):
                await run(ctx, cfg, "pipelined" if i % 2 else "blocking", f"question {i}")
            gc.collect()
            start = _rss_mb()
            for i in range(850):
                await run(ctx, cfg, "pipelined" if i % 2 else "blocking", f"question {i}")
            gc.collect()
            grown = _rss_mb() - start
        assert grown < 15, f"RSS grew {grown:.1f} MiB over 850 questions"
        for w in cluster.workers():
            assert not w.active
    finally:
        await cluster.close()
