"""The shell router's HTTP API on fake PD workers: whole graph, per-agent fan-out, OpenAI chat,
health, metrics, bad input, client disconnects."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer

from router.server import make_app
from sglang_ext import protocol as P
from tests.router_fixtures import smollm_tokenizer_path, start_fake_cluster, tree_config  # noqa: F401


@pytest.fixture
async def api(smollm_tokenizer_path):  # noqa: F811
    slow = {"decode": {"token_delay_s": 0.003}, "router": {"token_delay_s": 0.003}}
    cluster = await start_fake_cluster(smollm_tokenizer_path, **slow)
    cfg = tree_config(max_new_tokens=6)
    client = TestClient(TestServer(make_app(cluster.spec, {cfg.name: cfg})))
    await client.start_server()
    yield client, cluster, cfg
    await client.close()
    await cluster.close()


async def sse(resp) -> list[dict]:
    events = []
    async for line in resp.content:
        if (e := P.parse_sse_line(line.decode())) is not None:
            events.append(e)
    return events


async def test_whole_graph_both_modes(api):
    client, _, cfg = api
    out = {}
    for mode in ("pipelined", "blocking"):
        r = await client.post(
            "/v1/moa/run", json={"question": "2+3?", "config": cfg.name, "mode": mode}
        )
        assert r.status == 200, await r.text()
        out[mode] = await r.json()
        trace = out[mode]["trace"]
        assert set(trace) == {a.id for a in cfg.agents}
        for key in (
            "model",
            "output_ids",
            "text",
            "start_s",
            "first_token_s",
            "end_s",
            "warmups",
            "prompt_tokens",
            "cached_tokens",
            "slot_order",
            "killed",
        ):
            assert key in trace["final"]
    assert out["pipelined"]["answer"] == out["blocking"]["answer"] != ""
    assert out["pipelined"]["trace"]["final"]["warmups"] >= 1


async def test_inline_config_and_bad_input(api):
    client, _, cfg = api
    r = await client.post("/v1/moa/run", json={"question": "q", "config": cfg.model_dump()})
    assert r.status == 200
    bad = cfg.model_dump()
    bad["templates"]["aggregate_final"]["user"] += " <|answer:ghost|>"
    r = await client.post("/v1/moa/run", json={"question": "q", "config": bad})
    assert r.status == 400 and "ghost" in (await r.json())["message"]
    r = await client.post("/v1/moa/run", json={"question": "q", "config": cfg.name, "mode": "x"})
    assert r.status == 400 and "pipelined" in (await r.json())["message"]
    r = await client.post("/v1/moa/run", json={"question": "q", "config": "no_such_cfg"})
    assert r.status == 400 and "no such config" in (await r.json())["message"]
    r = await client.post("/v1/moa/run", data=b"{nope")
    assert r.status == 400


async def test_per_agent_fan_out_meets_in_one_session(api):
    client, _, cfg = api
    base = {"session_id": "s1", "config": cfg.name, "question": "2+3?", "mode": "pipelined"}
    # The aggregator's request comes first; its precursors arrive later on their own requests.
    order = ["final", "leaf_0_0", "leaf_0_1", "leaf_0_2"]
    resps = await asyncio.gather(
        *(client.post("/v1/moa/agent", json={**base, "agent": a}) for a in order)
    )
    streams = {a: await sse(r) for a, r in zip(order, resps)}
    for agent, events in streams.items():
        ids = [t for e in events if not e.get("done") for t in e[P.OUTPUT_IDS]]
        done = events[-1]
        assert done["done"] and done["trace"]["output_ids"] == ids and len(ids) == 6, agent
    assert streams["final"][-1]["trace"]["slot_order"] == ["leaf_0_0", "leaf_0_1", "leaf_0_2"]
    health = await (await client.get("/health")).json()
    assert health["sessions"] == 0  # released once every agent ended


async def test_chat_completions_streams_the_final_answer(api):
    client, _, cfg = api
    msgs = [{"role": "user", "content": "What is 2+3?"}]
    r = await client.post("/v1/chat/completions", json={"model": cfg.name, "messages": msgs})
    body = await r.json()
    answer = body["choices"][0]["message"]["content"]
    assert r.status == 200 and answer
    r = await client.post(
        "/v1/chat/completions", json={"model": cfg.name, "messages": msgs, "stream": True}
    )
    events = await sse(r)
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    assert text == answer and events[-1]["choices"][0]["finish_reason"] == "stop"


async def test_health_and_metrics(api):
    client, _, cfg = api
    await client.post("/v1/moa/run", json={"question": "q", "config": cfg.name})
    assert (await (await client.get("/health")).json())["status"] == "ok"
    text = await (await client.get("/metrics")).text()
    for name in (
        "moa_requests_total",
        "moa_warmups_total",
        "moa_cached_token_ratio",
        "moa_layer_latency_seconds",
    ):
        assert name in text


async def test_client_disconnect_aborts_the_agent(smollm_tokenizer_path):  # noqa: F811
    slow = {"decode": {"token_delay_s": 0.05}, "router": {"token_delay_s": 0.05}}
    cluster = await start_fake_cluster(smollm_tokenizer_path, **slow)
    cfg = tree_config(max_new_tokens=500)
    client = TestClient(TestServer(make_app(cluster.spec, {cfg.name: cfg})))
    await client.start_server()
    try:
        r = await client.post(
            "/v1/moa/agent",
            json={"session_id": "s2", "config": cfg.name, "question": "q", "agent": "leaf_0_0"},
        )
        await r.content.readline()  # the first token arrived
        assert cluster.router.active
        r.close()
        for _ in range(50):
            await asyncio.sleep(0.05)
            if not cluster.router.active and cluster.decodes[0].aborted:
                break
        assert not cluster.router.active
        assert any("leaf_0_0" in rid for rid in cluster.decodes[0].aborted)
    finally:
        await client.close()
        await cluster.close()
