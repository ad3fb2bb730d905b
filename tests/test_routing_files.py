"""Issue 30: no file a client names is read. A config registered over HTTP (POST /v1/moa/configs)
may use only the scorers and profiles the shell router loaded at start (by the path its start-up
config writes, or by sha256 digest) or send its own inline, as a JSON object (validated, at most
MAX_INLINE_BYTES); any other path is refused at registration with one message, whatever the path
is, and is never opened (inotify watches the probe folder; a FIFO would hang its reader). A
routed config's model sizes and embedding model follow the same rule. On fake PD workers; the
same probe on real processes: tests/test_real_processes_safety.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from file_watch import OpenWatch, fifo_tripwire
from test_routing import FIXTURE_SCORER, FakeEmbeddings, pooled

from router.api_request import CONFIGS, ROUTERS
from router.server import make_app
from routing import routing_files
from routing.router_hook import PoolRouters
from routing.routing_files import (
    MAX_INLINE_BYTES,
    RoutingFiles,
    content_digest,
    inline_routing_files,
)
from routing.scorer_file import Scorer
from tests.router_fixtures import smollm_tokenizer_path, start_fake_cluster, tree_config  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "tests" / "data" / "simulation" / "profile_cpu.json"
SIZES = {"smollm2": 0.1345}


def scorer_doc(n: int = 2) -> dict:
    """The fixture scorer cut to the candidates c0..c{n-1} of `pooled(n)`."""
    doc = json.loads(FIXTURE_SCORER.read_text())
    models = list(doc["candidates"].values())
    doc["candidates"] = {f"c{i}": models[i] for i in range(n)}
    return doc


def routed(name: str, scorer: object, **routing) -> dict:
    """A 2-candidate routed config on the fake cluster's smollm2."""
    raw = pooled(2, model_sizes_b=SIZES, **routing)
    raw["routing"]["scorer"] = scorer
    raw["routing"]["k"] = 1
    raw["sampling"] = {"max_new_tokens": 4, "temperature": 0.0}
    return {**raw, "name": name}


@pytest.fixture
async def api(smollm_tokenizer_path, tmp_path):  # noqa: F811
    """(client, start-up scorer path): the router starts with a tree config and a routed one
    whose scorer and profile it loads; routing embeds with a fake."""
    scorer = tmp_path / "startup" / "scorer.json"
    scorer.parent.mkdir()
    scorer.write_text(json.dumps(scorer_doc(), indent=1))
    start = routed("routed_start", str(scorer), profile=str(PROFILE))
    from router.config_loader import config_from_dict

    cfgs = [tree_config(max_new_tokens=4), config_from_dict(start)]
    fast = {"decode": {"token_delay_s": 0.001}}
    cluster = await start_fake_cluster(smollm_tokenizer_path, **fast)
    app = make_app(cluster.spec, {c.name: c for c in cfgs})
    app[ROUTERS] = PoolRouters(lambda name: FakeEmbeddings(), app[CONFIGS].files)
    client = TestClient(TestServer(app))
    await client.start_server()
    yield client, scorer
    await client.close()
    await cluster.close()


async def _served(client) -> list[str]:
    return [m["id"] for m in (await (await client.get("/v1/models")).json())["data"]]


@pytest.mark.parametrize("field", ["scorer", "profile"])
async def test_a_path_the_router_did_not_load_is_refused_alike_and_never_opened(
    api, tmp_path, field
):
    client, _ = api
    probe = tmp_path / "probe"
    (probe / "sub").mkdir(parents=True)
    (probe / "plain.txt").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (probe / "not_scorer.json").write_text(json.dumps({"a": 1}))
    (probe / "sub" / "scorer.json").write_text(json.dumps(scorer_doc()))  # scorer-shaped
    other_digest = (
        "sha256:" + hashlib.sha256((probe / "sub" / "scorer.json").read_bytes()).hexdigest()
    )
    with fifo_tripwire(probe / "fifo") as fifo, OpenWatch(probe, probe / "sub") as watch:
        (probe / "plain.txt").read_text()  # the watch sees an open: it works
        assert set(watch.touched()) == {str(probe / "plain.txt")}
        refs = [
            *(str(probe / n) for n in ("plain.txt", "missing.json", "not_scorer.json", "sub")),
            str(probe / "sub" / "scorer.json"),
            str(fifo),
            "/etc/passwd",
            "/etc/shadow",
            "/root/.bash_history",
            "/nonexistent/x.json",
            "tests/fixtures/scorer_pool_cpu.json",  # in the repository, where paths resolve
            other_digest,
            "sha256:" + "0" * 64,
            "",
            5,
            ["x"],
        ]
        bodies = []
        for i, ref in enumerate(refs):
            raw = routed(f"probe_{i}", scorer_doc())
            raw["routing"][field] = ref
            r = await client.post("/v1/moa/configs", json=raw)
            assert r.status == 400, (ref, await r.text())
            bodies.append(await r.read())
        assert watch.touched() == []  # nothing in the folder was opened, read or listed
    assert len(set(bodies)) == 1, {ref: b for ref, b in zip(refs, bodies, strict=True)}
    err = json.loads(bodies[0])["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == 400
    msg = err["message"]
    assert msg.startswith(f"request body: routing.{field}: a config registered over HTTP")
    assert "loaded at start" in msg and "inline" in msg and str(probe) not in msg
    assert "JSON" in msg and "No such file" not in msg and "cannot read" not in msg
    assert await _served(client) == ["routed_start", "tree_3_1_cpu"]
    r = await client.post("/v1/moa/run", json={"question": "2+2?", "config": "probe_0"})
    assert r.status == 404


async def test_a_loaded_file_by_path_digest_or_inline_copy_is_one_file(api):
    client, scorer = api
    digest = "sha256:" + hashlib.sha256(scorer.read_bytes()).hexdigest()
    prof_digest = "sha256:" + hashlib.sha256(PROFILE.read_bytes()).hexdigest()
    # The start-up config again, its scorer and profile by path, digest or inline: the same.
    for s, p in [
        (str(scorer), str(PROFILE)),
        (digest, prof_digest),
        (scorer_doc(), json.loads(PROFILE.read_text())),
    ]:
        r = await client.post("/v1/moa/configs", json=routed("routed_start", s, profile=p))
        assert r.status == 200 and (await r.json())["created"] is False, await r.text()
    for name, s in [("by_path", str(scorer)), ("by_digest", digest), ("inline", scorer_doc())]:
        r = await client.post("/v1/moa/configs", json=routed(name, s))
        assert r.status == 201, await r.text()
        r = await client.post("/v1/moa/run", json={"question": "2+2?", "config": name})
        assert r.status == 200, await r.text()
        assert len((await r.json())["routing"]["chosen"]) == 1
    # Another scorer inline is another file: served, and named by its digest from then on.
    other = scorer_doc()
    other["candidates"]["c0"] = {**other["candidates"]["c0"], "intercept": 3.0}
    r = await client.post("/v1/moa/configs", json=routed("mine", other))
    assert r.status == 201, await r.text()
    mine = content_digest(Scorer.model_validate(other))
    assert mine == (await r.json())["routing_files"]["scorer"]  # the answer names it
    r = await client.post("/v1/moa/configs", json=routed("mine", mine))
    assert r.status == 200, await r.text()
    r = await client.post("/v1/moa/configs", json=routed("mine", digest))
    assert r.status == 409  # the start-up scorer is another file: another config
    r = await client.post("/v1/moa/run", json={"question": "2+2?", "config": "mine"})
    assert r.status == 200, await r.text()


async def test_inline_files_are_validated_bounded_and_counted(api, monkeypatch):
    client, _ = api
    bad = scorer_doc()
    del bad["dim"]
    r = await client.post("/v1/moa/configs", json=routed("bad", bad))
    assert r.status == 400
    assert (await r.json())["message"] == (
        "request body: routing.scorer.dim: (inline scorer.json) required key 'dim' is missing; "
        "add it"
    )
    r = await client.post("/v1/moa/configs", json=routed("bad", scorer_doc(1)))
    assert r.status == 400 and "no model for pool candidates ['c1']" in (await r.json())["message"]
    r = await client.post(
        "/v1/moa/configs", json=routed("bad", {**scorer_doc(), "embedder": "/etc"})
    )
    assert r.status == 400 and "was trained on '/etc'" in (await r.json())["message"]
    big = {**scorer_doc(), "trained_on": {"pad": "x" * MAX_INLINE_BYTES}}
    r = await client.post("/v1/moa/configs", json=routed("big", big))
    assert r.status == 400
    assert f"bytes of JSON, over the {MAX_INLINE_BYTES}" in (await r.json())["message"]
    profile = json.loads(PROFILE.read_text())
    r = await client.post("/v1/moa/configs", json=routed("bad", scorer_doc(), profile={"x": 1}))
    assert r.status == 400 and "routing.profile" in (await r.json())["message"]
    # An inline file is kept only with a registration that is accepted; then they are counted.
    monkeypatch.setattr(routing_files, "MAX_INLINE_FILES", 1)
    tweaked = {**profile, "host": "elsewhere"}
    broken = routed("broken", scorer_doc(), profile=tweaked)
    broken["templates"]["agg"]["user"] += " <|answer:ghost|>"
    r = await client.post("/v1/moa/configs", json=broken)
    assert r.status == 400 and "ghost" in (await r.json())["message"]
    r = await client.post("/v1/moa/configs", json=routed("p1", scorer_doc(), profile=tweaked))
    assert r.status == 201, await r.text()
    r = await client.post("/v1/moa/configs", json=routed("p2", scorer_doc(), profile=profile))
    assert r.status == 201, await r.text()  # the start-up profile: no inline file kept
    again = {**profile, "host": "third"}
    r = await client.post("/v1/moa/configs", json=routed("p3", scorer_doc(), profile=again))
    assert r.status == 400 and "restart it" in (await r.json())["message"]


async def test_a_routed_config_sizes_models_and_embeds_only_as_the_router_does(api):
    client, _ = api
    # Without routing.model_sizes_b, the size comes from a model_path the router trusts.
    bodies = []
    for path in ("/etc", "/nonexistent", "org/model", "smollm2-135m-other"):
        raw = routed("sized", scorer_doc())
        del raw["routing"]["model_sizes_b"]
        raw["models"]["smollm2"]["model_path"] = path
        r = await client.post("/v1/moa/configs", json=raw)
        assert r.status == 400
        bodies.append((await r.json())["message"])
    assert len(set(bodies)) == 1 and "routing.model_sizes_b.smollm2" in bodies[0], bodies
    assert bodies[0].startswith("request body: models.smollm2.model_path: ")
    raw = routed("sized", scorer_doc())
    del raw["routing"]["model_sizes_b"]  # smollm2-135m: the start-up configs' own path
    r = await client.post("/v1/moa/configs", json=raw)
    assert r.status == 201, await r.text()
    # Routing embeds every question: its embedding model must be one the router loads.
    raw = routed("embeds", {**scorer_doc(), "embedder": "/etc"})
    raw["early_exit"] = {"method": "dmv", "embedding_model": "/etc"}
    r = await client.post("/v1/moa/configs", json=raw)
    assert r.status == 400 and "not loaded by this router" in (await r.json())["message"]


def test_a_router_never_reads_a_path_it_did_not_load_at_start(tmp_path):
    """Below the HTTP layer too: a config holding an unknown reference (none can be registered)
    is refused when routed, not read."""
    from router.config_loader import config_from_dict
    from routing.router_hook import load_scorer

    (tmp_path / "s.json").write_text(json.dumps(scorer_doc()))
    cfg = config_from_dict(routed("x", str(tmp_path / "s.json")))
    files = RoutingFiles.at_start([])
    with OpenWatch(tmp_path) as watch:
        with pytest.raises(ValueError, match="loaded at start"):
            load_scorer(cfg, "t", files)
        assert watch.touched() == []
    assert set(load_scorer(cfg, "t").candidates) == {"c0", "c1"}  # in-process: read on demand


def test_the_runner_sends_its_scorer_and_profile_inline(tmp_path):
    from experiments.run import RunSpec, variants
    from experiments.settings import parse_settings

    raw = routed("mine_routed", str(FIXTURE_SCORER), profile=str(PROFILE))
    (tmp_path / "mine.json").write_text(json.dumps(raw))
    spec = RunSpec("tree_3_1_cpu", None, "gsm8k", 1, parse_settings("6"), 1, tmp_path)
    spec.routed_config = str(tmp_path / "mine.json")
    ((sent, name, _),) = variants(spec, spec.settings[0])
    assert name == "mine_routed"
    assert sent["routing"]["scorer"] == json.loads(FIXTURE_SCORER.read_text())
    assert sent["routing"]["profile"] == json.loads(PROFILE.read_text())
    assert inline_routing_files(sent) == sent  # already inline: left as it is
