"""The shell router's OpenAI contract on fake PD workers: sampling fields reach the final agent
(and only it), usage per agent and model, /v1/models, /v1/completions, 400s that name the field,
JSON errors on every path, and a table-driven fuzz of every POST route (never a 5xx, and the
router still answers afterwards)."""

from __future__ import annotations

import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from router.server import make_app
from sglang_ext import protocol as P
from tests.fuzz_table import BODIES, ROUTER_ROUTES, huge_body
from tests.router_fixtures import smollm_tokenizer_path, start_fake_cluster, tree_config  # noqa: F401

MSGS = [{"role": "user", "content": "What is 2+3?"}]
BODY_LIMIT = 64 * 1024  # a small body limit, so "huge" is cheap to send


@pytest.fixture
async def api(smollm_tokenizer_path):  # noqa: F811
    cluster = await start_fake_cluster(smollm_tokenizer_path)
    cfg = tree_config(max_new_tokens=6)
    client = TestClient(
        TestServer(make_app(cluster.spec, {cfg.name: cfg}, client_max_size=BODY_LIMIT))
    )
    await client.start_server()
    yield client, cluster, cfg
    await client.close()
    await cluster.close()


def _sampling_by_agent(cluster) -> dict[str, dict]:
    """The sampling_params of each agent's request (each sent to its prefill and decode
    workers), by the agent id in its rid."""
    out = {}
    for r in [r for w in cluster.workers() for r in w.requests if P.SAMPLING_PARAMS in r]:
        rid = str(r.get("rid", ""))
        for agent in ("final", "leaf_0_0", "leaf_0_1", "leaf_0_2"):
            if agent in rid:
                out[agent] = r[P.SAMPLING_PARAMS]
    return out


async def test_sampling_fields_reach_the_final_agent_only(api):
    client, cluster, cfg = api
    body = {
        "model": cfg.name,
        "messages": MSGS,
        "max_tokens": 3,
        "stop": "never-seen",
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 7,
    }
    r = await client.post("/v1/chat/completions", json=body)
    out = await r.json()
    assert r.status == 200, out
    assert out["usage"]["completion_tokens"] == 3
    assert out["choices"][0]["finish_reason"] == "length"
    sampling = _sampling_by_agent(cluster)
    assert sampling["final"] == {
        "max_new_tokens": 3,
        "stop": ["never-seen"],
        "temperature": 0.5,
        "top_p": 0.9,
        "sampling_seed": 7,
    }
    assert sampling["leaf_0_0"] == {"max_new_tokens": 6, "temperature": 0.0}
    # Every agent's tokens, per agent and per model.
    moa = out["moa_usage"]
    assert set(moa["agents"]) == {a.id for a in cfg.agents}
    assert moa["agents"]["final"]["completion_tokens"] == 3
    assert moa["models"]["smollm2"]["completion_tokens"] == 3 * 6 + 3
    assert moa["total"]["prompt_tokens"] == sum(a["prompt_tokens"] for a in moa["agents"].values())


async def test_models_and_text_completions(api):
    client, _, cfg = api
    r = await client.get("/v1/models")
    assert r.status == 200
    assert [m["id"] for m in (await r.json())["data"]] == [cfg.name]
    r = await client.post(
        "/v1/completions", json={"model": cfg.name, "prompt": "2+3=", "max_tokens": 2}
    )
    out = await r.json()
    assert r.status == 200, out
    assert out["object"] == "text_completion" and out["choices"][0]["text"]
    assert out["usage"]["completion_tokens"] == 2
    r = await client.post(
        "/v1/completions",
        json={
            "model": cfg.name,
            "prompt": ["2+3="],
            "max_tokens": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    events = [P.parse_sse_line(line.decode()) async for line in r.content]
    events = [e for e in events if e is not None]
    text = "".join(c["text"] for e in events for c in e["choices"])
    assert text == out["choices"][0]["text"]
    assert events[-1]["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("max_tokens", "abc", "max_tokens"),
        ("max_tokens", 0, "max_tokens"),
        ("temperature", -1, "temperature"),
        ("top_p", 2, "top_p"),
        ("n", 5, "only n = 1"),
        ("stream", "yes", "stream"),
        ("stop", [f"s{i}" for i in range(10)], "stop"),
        ("seed", 1.5, "seed"),
        ("messages", [], "messages"),
        ("messages", [{"role": "user", "content": 3}], "messages"),
        ("model", 3, "model"),
        ("temprature", 0.1, "did you mean 'temperature'"),
    ],
)
async def test_bad_fields_are_400_naming_the_field(api, field, value, says):
    client, _, cfg = api
    r = await client.post(
        "/v1/chat/completions", json={"model": cfg.name, "messages": MSGS, field: value}
    )
    assert r.status == 400
    body = await r.json()
    assert says in body["error"]["message"], body


async def test_every_error_is_json(api):
    client, _, _ = api
    cases = [
        ("POST", "/v1/chat/completions", b'{"model": "\xff\xfe"}', 400, "not UTF-8"),
        ("POST", "/v1/chat/completions", b"x" * (100 * 1024), 413, "too large"),
        ("GET", "/v1/nothing", None, 404, "no route GET /v1/nothing"),
        ("GET", "/v1/chat/completions", None, 405, "Method Not Allowed"),
    ]
    for method, path, data, status, says in cases:
        r = await client.request(method, path, data=data)
        assert r.status == status, (path, await r.text())
        assert r.content_type == "application/json"
        assert says in (await r.json())["error"]["message"]


async def test_fuzz_every_post_route_no_5xx_and_still_serving(api):
    client, _, cfg = api
    seen = []
    for route in ROUTER_ROUTES:
        for data in [*BODIES, huge_body(BODY_LIMIT)]:
            r = await client.post(route, data=data, headers={"Content-Type": "application/json"})
            text = await r.text()
            seen.append((route, data[:40], r.status))
            assert r.status < 500, (route, data[:80], r.status, text)
            assert 400 <= r.status < 500 and "error" in json.loads(text), (route, text)
    assert len(seen) == len(ROUTER_ROUTES) * (len(BODIES) + 1)
    assert (await client.get("/health")).status == 200
    r = await client.post("/v1/chat/completions", json={"model": cfg.name, "messages": MSGS})
    assert r.status == 200
