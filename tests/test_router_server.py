"""The shell router's HTTP API on fake PD workers: whole graph, per-agent fan-out, OpenAI chat,
health, metric values, bad input, client disconnects, session expiry."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from router.api_request import CTX as CTX_KEY
from router.cluster import Timeouts
from router.server import make_app
from sglang_ext import protocol as P
from tests.router_fixtures import smollm_tokenizer_path, start_fake_cluster, tree_config  # noqa: F401


@pytest.fixture
async def api(smollm_tokenizer_path):  # noqa: F811
    slow = {"decode": {"token_delay_s": 0.003}}
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


async def test_registered_config_and_bad_input(api):
    client, _, cfg = api
    mine = {**cfg.model_dump(mode="json"), "name": "mine"}
    r = await client.post("/v1/moa/configs", json=mine)
    assert r.status == 201, await r.text()
    r = await client.post("/v1/moa/run", json={"question": "q", "config": "mine"})
    assert r.status == 200
    bad = {**cfg.model_dump(mode="json"), "name": "bad"}
    bad["templates"]["aggregate_final"]["user"] += " <|answer:ghost|>"
    r = await client.post("/v1/moa/configs", json=bad)
    assert r.status == 400 and "ghost" in (await r.json())["message"]
    r = await client.post("/v1/moa/run", json={"question": "q", "config": cfg.name, "mode": "x"})
    message = (await r.json())["message"]
    assert r.status == 400 and "pipelined" in message and "blocking_layer" in message
    r = await client.post(
        "/v1/moa/run", json={"question": "q", "config": cfg.name, "mode": "blocking_layer"}
    )
    assert r.status == 200 and (await r.json())["mode"] == "blocking_layer"
    r = await client.post("/v1/moa/run", json={"question": "q", "config": "no_such_cfg"})
    assert r.status == 404 and "not a topology this router serves" in (await r.json())["message"]
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


async def test_chat_completions_streams_the_final_answer(smollm_tokenizer_path):  # noqa: F811
    # Every streamed text but the last ends in half a character (U+FFFD): never sent.
    workers = {"decode": {"half_characters": True, "token_delay_s": 0.002}}
    async with _served(smollm_tokenizer_path, tree_config(max_new_tokens=6), **workers) as (
        client,
        _,
        cfg,
    ):
        msgs = [{"role": "user", "content": "What is 2+3?"}]
        r = await client.post("/v1/chat/completions", json={"model": cfg.name, "messages": msgs})
        body = await r.json()
        answer = body["choices"][0]["message"]["content"]
        assert r.status == 200 and answer and "\ufffd" not in answer
        # finish_reason is the final agent's own: the fake stops at max_new_tokens.
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 6
        r = await client.post(
            "/v1/chat/completions", json={"model": cfg.name, "messages": msgs, "stream": True}
        )
        events = await sse(r)
        deltas = [e["choices"][0]["delta"].get("content", "") for e in events]
        assert not any("\ufffd" in d for d in deltas) and len([d for d in deltas if d]) > 1
        assert "".join(deltas) == answer and events[-1]["choices"][0]["finish_reason"] == "length"


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_health_and_metrics(api):
    client, _, cfg = api
    r = await client.post("/v1/moa/run", json={"question": "q", "config": cfg.name})
    trace = (await r.json())["trace"]
    assert (await (await client.get("/health")).json())["status"] == "ok"
    m = _samples(await (await client.get("/metrics")).text())
    assert m[("moa_requests_total", (("endpoint", "/v1/moa/run"), ("status", "200")))] == 1
    assert m[("moa_warmups_total", (("model", "smollm2"),))] >= 1
    assert m[("moa_agents_total", (("model", "smollm2"), ("outcome", "ok")))] == 4
    ratio = (("mode", "pipelined"), ("model", "smollm2"))
    assert m[("moa_cached_token_ratio_count", ratio)] == 1  # the one successor's final request
    assert 0.5 < m[("moa_cached_token_ratio_sum", ratio)] <= 1
    # One observation per layer: its first agent's start to its last agent's end.
    for layer, agents in (("1", ["leaf_0_0", "leaf_0_1", "leaf_0_2"]), ("2", ["final"])):
        key = (("layer", layer), ("mode", "pipelined"))
        assert m[("moa_layer_latency_seconds_count", key)] == 1
        span = max(trace[a]["end_s"] for a in agents) - min(trace[a]["start_s"] for a in agents)
        assert m[("moa_layer_latency_seconds_sum", key)] == pytest.approx(span)


async def test_router_load_in_metrics_and_stats(api):
    """The event-loop lag probe runs with the app; /metrics and /v1/moa/stats show its
    histogram and the process's CPU seconds, which a question makes grow."""
    client, _, cfg = api
    r = await client.get("/v1/moa/stats")
    assert r.status == 200
    before = await r.json()
    assert before["object"] == "moa.router_stats" and before["event_loop_lag"]["period_s"] == 0.05
    r = await client.post("/v1/moa/run", json={"question": "q", "config": cfg.name})
    assert r.status == 200
    await asyncio.sleep(0.12)  # at least two more probe wakes
    after = await (await client.get("/v1/moa/stats")).json()
    assert after["boot_id"] == before["boot_id"] and after["time_s"] > before["time_s"]
    assert after["cpu_s"] > before["cpu_s"] > 0
    lag = after["event_loop_lag"]
    assert lag["count"] >= before["event_loop_lag"]["count"] + 2
    assert lag["le"][0] == 0.0001 and lag["counts"] == sorted(lag["counts"])
    assert lag["counts"][-1] <= lag["count"]

    m = _samples(await (await client.get("/metrics")).text())
    assert m[("moa_router_cpu_seconds_total", ())] >= after["cpu_s"]
    assert m[("moa_router_event_loop_lag_seconds_count", ())] >= lag["count"]
    assert m[("moa_router_event_loop_lag_seconds_bucket", (("le", "+Inf"),))] >= lag["count"]
    assert ("moa_router_event_loop_lag_seconds_bucket", (("le", "0.0001"),)) in m

    r = await client.post("/v1/moa/stats", json={})
    assert r.status == 405
    assert (await r.json())["error"]["message"] == "POST /v1/moa/stats: Method Not Allowed"


class _served:
    """A router app over a fresh fake cluster: `async with _served(...) as (client, cluster,
    cfg)`."""

    def __init__(self, tok_path: str, cfg, timeouts: Timeouts | None = None, **workers) -> None:
        self._args = tok_path, cfg, timeouts, workers

    async def __aenter__(self):
        tok_path, cfg, timeouts, workers = self._args
        self.cluster = await start_fake_cluster(tok_path, timeouts=timeouts, **workers)
        app = make_app(self.cluster.spec, {cfg.name: cfg})
        # As `python -m router` serves it: a client that goes away cancels its handler.
        self.client = TestClient(TestServer(app, handler_cancellation=True))
        await self.client.start_server()
        return self.client, self.cluster, cfg

    async def __aexit__(self, *exc) -> None:
        await self.client.close()
        await self.cluster.close()


async def _until(condition, seconds: float = 5.0) -> None:
    """Wait for condition(); fail the test if it does not hold within `seconds`."""
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"condition still false after {seconds} s")


SLOW = {"decode": {"token_delay_s": 0.05}}
AGENT = {"session_id": "s2", "question": "q", "agent": "leaf_0_0"}


async def test_a_disconnected_agent_nobody_needs_is_aborted(smollm_tokenizer_path):  # noqa: F811
    # The final agent: no successor reads it, so its client's disconnect cancels it at once.
    cfg = tree_config(max_new_tokens=500)
    async with _served(smollm_tokenizer_path, cfg, **SLOW) as (client, cluster, _):
        body = {**AGENT, "config": cfg.name}
        leaves = [
            await client.post("/v1/moa/agent", json={**body, "agent": a})
            for a in ("leaf_0_0", "leaf_0_1", "leaf_0_2")
        ]
        r = await client.post("/v1/moa/agent", json={**body, "agent": "final"})
        await _until(lambda: cluster.prefills[0].warmups())
        r.close()
        registry = client.app[CTX_KEY].metrics.registry

        def killed() -> float | None:
            labels = {"model": "smollm2", "outcome": "killed"}
            return registry.get_sample_value("moa_agents_total", labels)

        decode = cluster.decodes[0]
        await _until(lambda: killed() == 1)
        assert killed() == 1 and len(decode.active) == 3  # the leaves run on
        for leaf in leaves:
            leaf.close()
        await _until(lambda: not decode.active)
        assert not decode.active and not cluster.prefills[0].active
        leaf_rids = {r[P.RID] for r in decode.requests if "-leaf_" in r[P.RID]}
        assert len(leaf_rids) == 3 and leaf_rids <= set(decode.aborted)


async def test_a_disconnected_precursor_feeds_its_successor(smollm_tokenizer_path):  # noqa: F811
    cfg = tree_config(max_new_tokens=20)
    workers = {"decode": {"token_delay_s": 0.005, "delay_by_rid": {"leaf_": 0.01}}}
    async with _served(smollm_tokenizer_path, cfg, **workers) as (client, cluster, _):
        body = {**AGENT, "config": cfg.name}
        resps = {
            a: await client.post("/v1/moa/agent", json={**body, "agent": a})
            for a in ("final", "leaf_0_0", "leaf_0_1", "leaf_0_2")
        }
        await resps["leaf_0_0"].content.readline()  # its first token arrived
        resps["leaf_0_0"].close()
        final = await sse(resps["final"])
        assert "error" not in final[-2] and final[-1]["done"]
        assert final[-1]["trace"]["slot_order"] == ["leaf_0_0", "leaf_0_1", "leaf_0_2"]
        for a in ("leaf_0_1", "leaf_0_2"):
            await sse(resps[a])
        assert not any("leaf_0_0" in rid for rid in cluster.decodes[0].aborted)
        await _until(lambda: not cluster.decodes[0].active)
        health = await (await client.get("/health")).json()
        assert health["sessions"] == 0


async def test_an_agent_without_its_successor_ends_with_the_session(smollm_tokenizer_path):  # noqa: F811
    # leaf_0_0's successor never comes: the session's linger timeout ends it.
    cfg = tree_config(max_new_tokens=500)
    linger = Timeouts(read_s=10, warmup_s=10, precursor_wait_s=20, session_linger_s=0.2)
    async with _served(smollm_tokenizer_path, cfg, linger, **SLOW) as (client, cluster, _):
        r = await client.post("/v1/moa/agent", json={**AGENT, "config": cfg.name})
        await r.content.readline()  # the first token arrived
        r.close()
        await asyncio.sleep(0.1)
        assert cluster.decodes[0].active  # its successor may still come
        await _until(lambda: not cluster.decodes[0].active)
        # The session leaves the table first, then aborts its agents on the workers.
        await _until(lambda: any("leaf_0_0" in rid for rid in cluster.decodes[0].aborted))
        assert (await (await client.get("/health")).json())["sessions"] == 0
