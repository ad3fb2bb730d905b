"""Running question graphs on fake PD workers: the blocking/pipelined invariant, the layer
barrier of blocking_layer (with early exit), dynamic slot order, stickiness to a prefill worker
and DP rank, cumulative streams, trace fields, failures named by precursor or hook, timeouts,
aborts, memory over many questions."""

from __future__ import annotations

import asyncio
import gc
import resource

import pytest

from router.cluster import Timeouts
from router.context import ConfigNotServed, RouterContext
from router.orchestrator import AgentFailed, Session
from router.template import clean_output
from sglang_ext import protocol as P
from tests.router_fixtures import (  # noqa: F401
    smollm_tokenizer_path,
    start_fake_cluster,
    tree_config,
)

FAST = {"decode": {"token_delay_s": 0.002}}


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
                by_layer = await run(ctx, cfg, "blocking_layer", q, slot_orders=orders)
                for other in (blocked, by_layer):
                    for agent, t in piped.trace.items():
                        assert t["output_ids"] == other.trace[agent]["output_ids"], agent
                        assert t["slot_order"] == other.trace[agent]["slot_order"]
                    assert piped.answer == other.answer
                    assert all(t["warmups"] == 0 for t in other.trace.values())
                succ = [t for t in piped.trace.values() if t["slot_order"]]
                assert all(t["warmups"] >= 1 for t in succ)
                # The final request found everything warmed in the prefill worker's cache.
                assert all(t["cached_tokens"] >= t["warmup_lengths"][-1] for t in succ)
        # Each final request reached the prefill worker and a decode worker with one room; the
        # decode worker (the fake checks it) was told the prefill worker's host.
        finals = {r[P.RID]: r for r in cluster.prefills[0].finals()}
        decoded = {r[P.RID]: r for r in cluster.decodes[0].requests}
        assert finals and set(finals) == set(decoded)
        for rid, r in finals.items():
            assert r[P.BOOTSTRAP_ROOM] == decoded[rid][P.BOOTSTRAP_ROOM] is not None
            assert decoded[rid][P.BOOTSTRAP_HOST] == cluster.prefills[0].host
    finally:
        await cluster.close()


async def test_shortest_first_needs_no_forced_order_for_identical_tokens(
    smollm_tokenizer_path,  # noqa: F811
):
    """With slot_order shortest_first the order is a function of the outputs: blocking builds
    pipelined's prompts on its own (no slot_orders handed over), and a precursor written
    shorter takes an earlier position than the template gives it."""
    cluster = await start_fake_cluster(smollm_tokenizer_path, **FAST)
    base = tree_config("tree_3_1_cpu", max_new_tokens=12, slot_order="shortest_first")
    lengths = {"leaf_0_0": 14, "leaf_0_1": 6, "leaf_0_2": 10}  # the fake writes its budget
    cfg = base.model_copy(
        update={
            "agents": [
                a.model_copy(
                    update={"sampling": a.sampling.model_copy(update={"max_new_tokens": n})}
                )
                if (n := lengths.get(a.id))
                else a
                for a in base.agents
            ]
        }
    )
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            piped = await run(ctx, cfg, "pipelined")
            blocked = await run(ctx, cfg, "blocking")
        for agent, t in piped.trace.items():
            assert t["output_ids"] == blocked.trace[agent]["output_ids"], agent
        assert piped.trace["final"]["slot_order"] == ["leaf_0_1", "leaf_0_2", "leaf_0_0"]
        assert blocked.trace["final"]["slot_order"] == piped.trace["final"]["slot_order"]
        assert piped.trace["final"]["warmups"] >= 1
    finally:
        await cluster.close()


def _layer_ends(trace: dict) -> dict[int, float]:
    ends: dict[int, float] = {}
    for t in trace.values():
        ends[t["layer"]] = max(ends.get(t["layer"], 0.0), t["end_s"])
    return ends


async def test_blocking_by_layer_waits_for_the_whole_previous_layer(smollm_tokenizer_path):  # noqa: F811
    # Cluster 0's leaves decode ten times slower: agg_1 and agg_2 could start long before.
    delays = {"leaf_0_": 0.03}
    cluster = await start_fake_cluster(
        smollm_tokenizer_path,
        decode={"token_delay_s": 0.003, "delay_by_rid": delays},
    )
    cfg = tree_config("tree_9_3_1_cpu", max_new_tokens=10)
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            blocked = await run(ctx, cfg, "blocking")
            by_layer = await run(ctx, cfg, "blocking_layer")
        # blocking: agg_1 goes as soon as its own cluster is done, before cluster 0 ends.
        ends = _layer_ends(blocked.trace)
        assert blocked.trace["agg_1"]["final_request_s"] < ends[1]
        # blocking_layer: no agent of layer k sends its request before all of layer k-1 ended.
        ends = _layer_ends(by_layer.trace)
        for agent, t in by_layer.trace.items():
            if t["layer"] > 1:
                assert t["final_request_s"] >= ends[t["layer"] - 1], agent
        assert all(t["output_ids"] for t in by_layer.trace.values())
    finally:
        await cluster.close()


async def test_a_pruned_agent_counts_as_ended_at_the_layer_barrier(smollm_tokenizer_path):  # noqa: F811
    # leaf_0_1 would decode for ~6 s; early exit prunes it once leaf_0_0 completed.
    cluster = await start_fake_cluster(
        smollm_tokenizer_path,
        decode={"token_delay_s": 0.003, "delay_by_rid": {"leaf_0_1": 0.3}},
    )

    async def hook(session, successor, agent):
        return ["leaf_0_1"] if (successor, agent) == ("agg_0", "leaf_0_0") else []

    cfg = tree_config("tree_9_3_1_cpu", max_new_tokens=20)
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            session = Session(ctx, cfg, "q", "blocking_layer", on_completion=hook)
            result = await asyncio.wait_for(session.run_all(), 20)
        pruned = result.trace["leaf_0_1"]
        assert pruned["killed"] and pruned["end_s"] < 3
        ends = _layer_ends(result.trace)
        for agent in ("agg_0", "agg_1", "agg_2"):
            t = result.trace[agent]
            assert ends[1] <= t["final_request_s"] < 3, agent
        assert result.trace["agg_0"]["slot_order"] == ["leaf_0_0", "leaf_0_2"]
        assert result.trace["final"]["final_request_s"] >= ends[2]
    finally:
        await cluster.close()


async def test_dynamic_order_follows_the_precursors_speed(smollm_tokenizer_path):  # noqa: F811
    # leaf_0_2 finishes first, leaf_0_0 last: the reverse of the template's order.
    delays = {"leaf_0_0": 0.03, "leaf_0_1": 0.015}
    cluster = await start_fake_cluster(
        smollm_tokenizer_path,
        decode={"token_delay_s": 0.001, "delay_by_rid": delays},
    )
    cfg = tree_config(max_new_tokens=8, slot_order="dynamic")
    order = ["leaf_0_2", "leaf_0_1", "leaf_0_0"]
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            piped = await run(ctx, cfg, "pipelined")
            blocked = await run(ctx, cfg, "blocking")
            eot = ctx.tokenizer("smollm2").eot_ids
        for result in (piped, blocked):
            assert result.trace["final"]["slot_order"] == order
        assert piped.trace["final"]["output_ids"] == blocked.trace["final"]["output_ids"]
        # The final prompt lists the candidates in that order.
        prompt = next(r for r in cluster.prefills[0].finals() if "-final-" in r[P.RID])
        ids = prompt[P.INPUT_IDS]
        starts = [_find(ids, clean_output(piped.trace[a]["output_ids"], eot)) for a in order]
        assert -1 not in starts and starts == sorted(starts)
    finally:
        await cluster.close()


def _find(haystack: list[int], needle: list[int]) -> int:
    return next((i for i in range(len(haystack)) if haystack[i : i + len(needle)] == needle), -1)


async def test_cached_tokens_are_the_prefill_workers_or_decodes(smollm_tokenizer_path):  # noqa: F811
    cluster = await start_fake_cluster(smollm_tokenizer_path, **FAST)
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            result = await run(ctx, tree_config(), "pipelined")
        final = result.trace["final"]
        # The fake decode worker reports 0 cached tokens; the prefill worker found the warm-ups.
        assert final["cached_tokens"] >= final["warmup_lengths"][-1] > 0
        assert final["prompt_tokens"] > final["cached_tokens"]
        # The leaves share their template's prefix: after the first, the prefill worker found
        # it (the fake decode worker would have said 0).
        leaves = [result.trace[a] for a in ("leaf_0_0", "leaf_0_1", "leaf_0_2")]
        assert all(t["prompt_tokens"] > 0 for t in leaves)
        assert max(t["cached_tokens"] for t in leaves) > 0
    finally:
        await cluster.close()


@pytest.mark.parametrize("verb", ["generate", "prefill_only"])
async def test_warmups_and_final_request_share_a_dp_rank(smollm_tokenizer_path, verb):  # noqa: F811
    cluster = await start_fake_cluster(
        smollm_tokenizer_path, prefill_dp_size=2, warmup_verb=verb, **FAST
    )
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            result = await run(ctx, tree_config("tree_9_3_1_cpu", max_new_tokens=10), "pipelined")
        ranks, warmed = set(), 0
        for agent in ("agg_0", "agg_1", "agg_2", "final"):
            mine = [r for r in cluster.prefills[0].requests if f"-{agent}-" in r[P.RID]]
            t = result.trace[agent]
            assert len(mine) == t["warmups"] + 1
            assert len({r["_rank"] for r in mine}) == 1, agent  # one rank, one radix cache
            if t["warmups"]:
                warmed += 1
                assert t["cached_tokens"] >= t["warmup_lengths"][-1]
            ranks.add(mine[0]["_rank"])
        assert ranks == {0, 1}  # four successors spread over both ranks
        # A successor whose precursors all ended before the gate opened sends no warm-up (on a
        # loaded machine one of the 10-token clusters can): several were warmed.
        assert warmed >= 2
    finally:
        await cluster.close()


async def test_cumulative_streams_without_text(smollm_tokenizer_path):  # noqa: F811
    # Real SGLang with --skip-tokenizer-init: every id so far in each chunk, no text.
    cumulative = {"decode": {"cumulative_ids": True}}
    plain = await start_fake_cluster(smollm_tokenizer_path)
    cum = await start_fake_cluster(smollm_tokenizer_path, **cumulative)
    cfg = tree_config(max_new_tokens=10)
    try:
        async with RouterContext.open(plain.spec) as ctx:
            expected = await run(ctx, cfg, "pipelined")
        async with RouterContext.open(cum.spec) as ctx:
            tok = ctx.tokenizer("smollm2").tok
            for mode in ("pipelined", "blocking"):
                result = await run(ctx, cfg, mode)
                for agent, t in result.trace.items():
                    assert t["output_ids"] == expected.trace[agent]["output_ids"], agent
                    assert len(t["output_ids"]) == 10
                    assert t["text"] == tok.decode(t["output_ids"], skip_special_tokens=True)
                assert result.answer == result.trace["final"]["text"] != ""
    finally:
        await plain.close()
        await cum.close()


async def test_rids_differ_across_sessions_with_one_id(smollm_tokenizer_path):  # noqa: F811
    cluster = await start_fake_cluster(smollm_tokenizer_path, **FAST)
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            for _ in range(2):
                await run(ctx, tree_config(), "pipelined", session_id="same-id")
        rids = [r[P.RID] for w in cluster.workers() for r in w.requests]
        warm = [r for r in rids if r.startswith(P.WARMUP_RID_PREFIX)]
        assert warm and len(set(warm)) == len(warm)  # warm-up rids have no random part
        finals = cluster.prefills[0].finals()  # every agent's PD request, two sessions
        assert len({r[P.RID] for r in finals}) == len(finals) == 8
    finally:
        await cluster.close()


async def test_a_failing_early_exit_hook_fails_the_session(smollm_tokenizer_path):  # noqa: F811
    slow = {"decode": {"token_delay_s": 0.01, "delay_by_rid": {"leaf_0_0": 0.001}}}
    cluster = await start_fake_cluster(smollm_tokenizer_path, **slow)

    async def hook(session, successor, agent):
        raise RuntimeError("boom")

    try:
        async with RouterContext.open(cluster.spec) as ctx:
            session = Session(
                ctx, tree_config(max_new_tokens=30), "q", "pipelined", on_completion=hook
            )
            with pytest.raises(AgentFailed) as e:
                await asyncio.wait_for(session.run_all(), 10)
        msg = str(e.value)
        assert "early exit failed after agent 'leaf_0_0' completed" in msg and "boom" in msg
        # The other agents were stopped (the final one may fail first, on its killed
        # precursors), and their requests aborted.
        trace = session.trace()
        assert trace["leaf_0_1"]["killed"] and trace["leaf_0_2"]["killed"]
        assert trace["final"]["killed"] or "aborted" in trace["final"]["error"]
        await asyncio.sleep(0.05)
        for w in cluster.workers():
            assert not w.active, w.role
    finally:
        await cluster.close()


async def test_successors_stick_to_one_prefill_worker(smollm_tokenizer_path):  # noqa: F811
    cluster = await start_fake_cluster(smollm_tokenizer_path, n_prefill=2, n_decode=2, **FAST)
    cfg = tree_config("tree_9_3_1_cpu", max_new_tokens=10)
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            result = await run(ctx, cfg, "pipelined")
        for agent, t in result.trace.items():
            if not t["slot_order"]:
                continue
            worker = cluster.prefills[t["prefill_replica"]]
            other = next(w for w in cluster.prefills if w is not worker)
            mine = [r for r in worker.requests if f"-{agent}-" in r["rid"]]
            assert len(mine) == t["warmups"] + 1  # every warm-up and the final request
            assert not [r for r in other.requests if f"-{agent}-" in r["rid"]]
        # Thirteen requests spread over both workers of each role, by load.
        assert all(p.finals() for p in cluster.prefills)
        assert all(d.finals() for d in cluster.decodes)
    finally:
        await cluster.close()


async def test_a_failing_precursor_is_named(smollm_tokenizer_path, caplog):  # noqa: F811
    cluster = await start_fake_cluster(
        smollm_tokenizer_path, decode={"fail_rids_containing": "leaf_0_1"}
    )
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            with pytest.raises(AgentFailed) as e:
                await run(ctx, tree_config(), "pipelined")
        msg = str(e.value)
        assert "precursor 'leaf_0_1' failed" in msg and "HTTP 500" in msg
        assert e.value.status == 502  # a worker's 5xx is the deployment's fault
        # The worker's URL is for the operator's log, never for the client.
        url = cluster.decodes[0].url
        assert url not in msg and url in caplog.text
    finally:
        await cluster.close()


async def test_a_hanging_worker_times_out_and_is_aborted(smollm_tokenizer_path):  # noqa: F811
    cluster = await start_fake_cluster(
        smollm_tokenizer_path, timeouts=Timeouts(read_s=0.3), decode={"hang": True}
    )
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            with pytest.raises(AgentFailed, match=r"decode request failed: no data for 0.3s"):
                await asyncio.wait_for(run(ctx, tree_config(), "blocking"), 10)
        await asyncio.sleep(0.05)
        assert not cluster.decodes[0].active  # the abort released it
        assert cluster.decodes[0].aborted
    finally:
        await cluster.close()


async def test_a_worker_that_is_down(smollm_tokenizer_path):  # noqa: F811
    cluster = await start_fake_cluster(smollm_tokenizer_path)
    await cluster.decodes[0].server.close()
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            with pytest.raises(AgentFailed, match="decode request failed: cannot connect"):
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
    cluster = await start_fake_cluster(smollm_tokenizer_path, decode={"token_delay_s": 0.05})
    try:
        async with RouterContext.open(cluster.spec) as ctx:
            session = Session(ctx, tree_config(max_new_tokens=200), "q", "pipelined")
            task = asyncio.create_task(session.run_all())
            for _ in range(100):
                if len(cluster.decodes[0].active) == 3 and cluster.prefills[0].warmups():
                    break
                await asyncio.sleep(0.05)
            assert cluster.decodes[0].active
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.05)
            assert all(t["killed"] for t in session.trace().values())
        for w in cluster.workers():
            assert not w.active, w.role
        # Both workers of each request are told its rid.
        leaf_rids = {r["rid"] for r in cluster.decodes[0].requests if "-leaf_" in r["rid"]}
        assert len(leaf_rids) == 3
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


@pytest.mark.parametrize("slots", [1, 2])
async def test_a_shared_device_keeps_warmups_off_busy_decoding(
    smollm_tokenizer_path,  # noqa: F811
    slots,
):
    """Prefill and decode workers on one device (router/compute_device.py). With one slot the
    decoding leaves fill it, so the successor is never warmed while they decode; with two a
    warm-up fits beside them. Outputs are the same either way, and no busy count leaks."""
    cluster = await start_fake_cluster(smollm_tokenizer_path, **FAST)
    m = cluster.spec.models["smollm2"]
    spec = cluster.spec.model_copy(
        update={
            "devices": {"gpu0": slots},
            "models": {
                "smollm2": m.model_copy(
                    update={"prefill_devices": ["gpu0"], "decode_devices": ["gpu0"]}
                )
            },
        }
    )
    cfg = tree_config(max_new_tokens=24)
    try:
        async with RouterContext.open(spec) as ctx:
            piped = await run(ctx, cfg, "pipelined")
            blocked = await run(ctx, cfg, "blocking")
            assert ctx.devices["gpu0"].busy_workers() == set()
        for agent, t in piped.trace.items():
            assert t["output_ids"] == blocked.trace[agent]["output_ids"], agent
        (warmups,) = [t["warmups"] for t in piped.trace.values() if t["slot_order"]]
        assert warmups == 0 if slots == 1 else warmups >= 1
    finally:
        await cluster.close()
