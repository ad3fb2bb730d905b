"""The shell router as an exposed endpoint, on fake PD workers: it serves only its own topologies
(a name is never read as a path; registration through POST /v1/moa/configs), an optional API key,
a question too long for a model's context is a 400 before anything is sent, a worker's refusal
is a 400, and no error shows an internal address. The same on real processes:
tests/test_real_processes_api.py."""

from __future__ import annotations

import json
import os
import stat

import pytest
from aiohttp.test_utils import TestClient, TestServer

from router.api_errors import scrub
from router.api_key import read_key_file, write_key_file
from router.server import make_app
from tests.router_fixtures import smollm_tokenizer_path, start_fake_cluster, tree_config  # noqa: F401

MSGS = [{"role": "user", "content": "2+3?"}]
KEY = "s3cret-key-for-tests"


async def _client(cluster_spec, cfg, **kw) -> TestClient:
    client = TestClient(TestServer(make_app(cluster_spec, {cfg.name: cfg}, **kw)))
    await client.start_server()
    return client


def _renamed(config: dict, name: str) -> dict:
    """A deep copy of a config object under another name."""
    return {**json.loads(json.dumps(config)), "name": name}


@pytest.fixture
async def api(smollm_tokenizer_path):  # noqa: F811
    cluster = await start_fake_cluster(smollm_tokenizer_path)
    cfg = tree_config(max_new_tokens=4)
    client = await _client(cluster.spec, cfg)
    yield client, cluster, cfg
    await client.close()
    await cluster.close()


@pytest.mark.parametrize(
    "name",
    ["/etc/passwd", "../../etc/hostname", "cfgs/tree_9_3_1_cpu.json", "tree_9_3_1_cpu", ""],
)
async def test_a_name_that_is_not_served_is_404_and_never_read(api, name):
    client, _, cfg = api
    r = await client.post("/v1/chat/completions", json={"model": name, "messages": MSGS})
    assert r.status == 404, await r.text()
    err = (await r.json())["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == "model"
    assert err["code"] == "model_not_found" and cfg.name in err["message"]
    # Nothing of the file leaks: no JSON or schema error, no "no such file".
    assert "JSON" not in err["message"] and "required key" not in err["message"]
    r = await client.post("/v1/moa/run", json={"question": "q", "config": name})
    assert r.status == 404 and (await r.json())["error"]["param"] == "config"


async def test_inline_configs_are_refused_and_registration_serves_them(api):
    client, _, cfg = api
    body = cfg.model_dump(mode="json")
    r = await client.post("/v1/moa/run", json={"question": "q", "config": body})
    assert r.status == 400 and "POST /v1/moa/configs" in (await r.json())["message"]
    mine = {**body, "name": "my_tree"}
    r = await client.post("/v1/moa/configs", json=mine)
    assert r.status == 201, await r.text()
    r = await client.post("/v1/moa/configs", json=mine)
    assert r.status == 200  # the same again: idempotent
    other = {**mine, "slot_order": "dynamic"}
    r = await client.post("/v1/moa/configs", json=other)
    assert r.status == 409 and (await r.json())["error"]["code"] == "config_conflict"
    models = [m["id"] for m in (await (await client.get("/v1/models")).json())["data"]]
    assert models == sorted([cfg.name, "my_tree"])
    r = await client.post("/v1/chat/completions", json={"model": "my_tree", "messages": MSGS})
    assert r.status == 200, await r.text()
    # Registration validates: a broken template, a model not served, an unloaded embedder.
    bad = _renamed(body, "bad")
    bad["templates"]["aggregate_final"]["user"] += " <|answer:ghost|>"
    r = await client.post("/v1/moa/configs", json=bad)
    assert r.status == 400 and "ghost" in (await r.json())["message"]
    foreign = _renamed(body, "foreign")
    foreign["agents"][0]["model"] = "qwen3vl-32b"
    foreign["models"]["qwen3vl-32b"] = foreign["models"]["smollm2"]
    r = await client.post("/v1/moa/configs", json=foreign)
    assert r.status == 400 and "does not serve" in (await r.json())["message"]
    probe = {**body, "name": "probe", "early_exit": {"method": "q", "embedding_model": "/etc"}}
    r = await client.post("/v1/moa/configs", json=probe)
    assert r.status == 400 and "not loaded by this router" in (await r.json())["message"]
    r = await client.post("/v1/moa/configs", data=b"/etc/passwd")
    assert r.status == 400


async def test_api_key_guards_every_route_but_health(smollm_tokenizer_path):  # noqa: F811
    cluster = await start_fake_cluster(smollm_tokenizer_path)
    cfg = tree_config(max_new_tokens=4)
    client = await _client(cluster.spec, cfg, api_key=KEY)
    chat = {"model": cfg.name, "messages": MSGS}
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
                                 ("GET", "/metrics"), ("POST", "/v1/moa/configs")):  # fmt: skip
                r = await client.request(method, path, json=chat, headers=headers)
                assert r.status == 401, (path, headers, r.status)
                err = (await r.json())["error"]
                assert err["code"] == "invalid_api_key" and KEY not in json.dumps(err)
                assert r.headers["WWW-Authenticate"] == "Bearer"
        r = await client.get("/health")  # open to probes, but says nothing of what runs where
        assert r.status == 200 and await r.json() == {"status": "ok"}
        ok = {"Authorization": f"Bearer {KEY}"}
        assert (await (await client.get("/health", headers=ok)).json())["models"] == ["smollm2"]
        r = await client.post("/v1/chat/completions", json=chat, headers=ok)
        assert r.status == 200, await r.text()
    finally:
        await client.close()
        await cluster.close()


def test_key_file_is_owner_only(tmp_path):
    path = write_key_file(tmp_path / "api_key", KEY)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert read_key_file(path) == KEY


async def test_a_question_over_the_context_is_400_before_anything_is_sent(
    smollm_tokenizer_path,  # noqa: F811
):
    cluster = await start_fake_cluster(smollm_tokenizer_path)
    model = cluster.spec.models["smollm2"].model_copy(update={"context_len": 300})
    spec = cluster.spec.model_copy(update={"models": {"smollm2": model}})
    cfg = tree_config(max_new_tokens=4)
    client = await _client(spec, cfg)
    try:
        long_q = "Count the apples. " * 100
        r = await client.post(
            "/v1/chat/completions",
            json={"model": cfg.name, "messages": [{"role": "user", "content": long_q}]},
        )
        assert r.status == 400, await r.text()
        msg = (await r.json())["message"]
        assert "agent 'leaf_0_0'" in msg and "300 tokens" in msg and "prompt" in msg, msg
        assert not [w.requests for w in cluster.workers() if w.requests]  # nothing went out
        # Within the prompt but not with the answer's budget: the same, naming max_tokens.
        r = await client.post(
            "/v1/chat/completions",
            json={"model": cfg.name, "messages": MSGS, "max_tokens": 290},
        )
        assert r.status == 400 and "max_tokens" in (await r.json())["message"]
        r = await client.post("/v1/chat/completions", json={"model": cfg.name, "messages": MSGS})
        assert r.status == 200, await r.text()
    finally:
        await client.close()
        await cluster.close()


async def test_a_worker_refusal_is_400_without_internal_addresses(
    smollm_tokenizer_path,  # noqa: F811
):
    cluster = await start_fake_cluster(
        smollm_tokenizer_path, decode={"fail_rids_containing": "leaf_0_1", "fail_status": 400}
    )
    cfg = tree_config(max_new_tokens=4)
    client = await _client(cluster.spec, cfg)
    try:
        r = await client.post("/v1/chat/completions", json={"model": cfg.name, "messages": MSGS})
        assert r.status == 400, await r.text()
        text = await r.text()
        assert "leaf_0_1" in text and "injected failure" in text, text
        assert "127.0.0.1" not in text and "http://" not in text, text
        r = await client.post("/v1/moa/run", json={"question": "q", "config": cfg.name})
        assert r.status == 400 and "127.0.0.1" not in (await r.json())["message"]
        agent = {"session_id": "s1", "config": cfg.name, "question": "q", "agent": "leaf_0_1"}
        r = await client.post("/v1/moa/agent", json={**agent, "stream": False})
        assert r.status == 400 and "127.0.0.1" not in await r.text(), await r.text()
    finally:
        await client.close()
        await cluster.close()


def test_scrub_hides_addresses():
    text = (
        "warm-up request to http://127.0.0.1:4321/generate failed: Cannot connect to host "
        "node7:4321 ssl:default [Connect call failed ('10.0.0.5', 4321)]; see /tmp/x/logs/a.log"
    )
    out = scrub(text)
    assert "4321" not in out and "10.0.0.5" not in out and "node7" not in out
    assert "/tmp/x/logs/a.log" in out  # log paths stay: they tell an operator where to look


def test_registrations_are_bounded(monkeypatch):
    from router import served_configs
    from router.served_configs import RegistrationRefused, ServedConfigs

    monkeypatch.setattr(served_configs, "MAX_REGISTERED", 1)
    cfg = tree_config()
    served = ServedConfigs({cfg.name: cfg})
    assert served.register(cfg.model_copy(update={"name": "a"})) is True
    with pytest.raises(RegistrationRefused, match="restart it"):
        served.register(cfg.model_copy(update={"name": "b"}))
    assert served.names() == sorted([cfg.name, "a"])
