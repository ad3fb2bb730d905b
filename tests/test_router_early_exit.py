"""Early exit wired into the shell router (router/early_exit_hook.py) on fake PD workers: exits
abort and drop precursors, warm-ups stay valid or re-warm from the longest valid prefix, no exit
at Q=0, min_completed, the 10-key records, DMV, aggregator bypass, reproducible draws, the HTTP
response; one slow test on the real engine with the real MiniLM embedder."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from launch.ports import free_port
from router import early_exit
from router.cluster import ClusterSpec
from router.config import AggregatorBypass, EarlyExit, Sampling
from router.context import RouterContext
from router.early_exit import RECORD_KEYS, activation_percentage
from router.early_exit_hook import EarlyExitHooks, last_answer
from router.embedder import EmbedderError
from router.incremental import common_prefix_len
from router.orchestrator import AgentFailed, Session
from router.server import make_app
from router.template import build_pieces, clean_output
from sglang_ext import protocol as P
from tests.router_fixtures import (  # noqa: F401
    FakeCluster,
    FakeWorker,
    smollm_tokenizer_path,
    stack_cluster,
    start_fake_cluster,
    tree_config,
)

QUESTION = "What is 2+3?"
DELAY = 0.01


@dataclass
class HoldingWorker(FakeWorker):
    """A fake decode worker that holds requests whose rid names one of `hold` until aborted, so
    that agent produces no token before early exit kills it. It first sends an event with no
    token (its prefill is over), as a slow decode would: the router's PrefillGate then lets
    warm-ups through."""

    hold: tuple[str, ...] = ()

    async def _decode(self, request, body, ids, stop):
        rid = body.get(P.RID, "")
        if not any(f"-{h}-" in rid for h in self.hold):
            return await super()._decode(request, body, ids, stop)
        resp = web.StreamResponse(headers={"Content-Type": P.SSE_CONTENT_TYPE})
        await resp.prepare(request)
        meta = {P.META_ID: rid, P.PROMPT_TOKENS: len(ids), P.COMPLETION_TOKENS: 0}
        await resp.write(P.sse_event({P.OUTPUT_IDS: [], P.META_INFO: meta}))
        await stop.wait()
        await resp.write(P.sse_done())
        return resp


class FakeEmbedder:
    """Deterministic [n_words, 8] 'embeddings' of a text; no torch."""

    def embed(self, text: str) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha1(text.encode()).digest()[:4], "little")
        n = max(1, len(text.split()))
        return np.random.default_rng(seed).standard_normal((n, 8)).astype(np.float32)


class SlowEmbedder(FakeEmbedder):
    """Takes `delay_s` per text (on the embedding thread), so agents finish while it runs."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def embed(self, text: str) -> np.ndarray:
        time.sleep(self.delay_s)
        return super().embed(text)


class BrokenEmbedder:
    def embed(self, text: str) -> np.ndarray:
        raise RuntimeError("embedding kernel exploded")


def fake_hooks(extractor=last_answer, embedder=None) -> EarlyExitHooks:
    embedder = embedder or FakeEmbedder()
    return EarlyExitHooks(answer_extractor=extractor, embedder_factory=lambda _name: embedder)


async def cluster_holding(tok_path: str, hold: tuple[str, ...] = ()) -> FakeCluster:
    c = await start_fake_cluster(tok_path)
    await c.decodes[0].server.close()
    rooms = c.prefills[0].rooms
    decode = await HoldingWorker("decode", token_delay_s=DELAY, rooms=rooms, hold=hold).start()
    data = c.spec.model_dump()
    data["models"]["smollm2"]["decode_urls"] = [decode.url]
    return FakeCluster(ClusterSpec.model_validate(data), c.prefills, [decode], c.router)


def ee_config(tokens: dict[str, int] | None = None, bypass: dict | None = None, **ee):
    cfg = tree_config(max_new_tokens=6)
    tokens = tokens or {}
    agents = [
        a.model_copy(update={"sampling": Sampling(max_new_tokens=tokens[a.id])})
        if a.id in tokens
        else a
        for a in cfg.agents
    ]
    return cfg.model_copy(
        update={
            "agents": agents,
            "early_exit": EarlyExit(enabled=True, **ee),
            "aggregator_bypass": AggregatorBypass(**(bypass or {})),
        }
    )


def force_q(monkeypatch, q: float) -> None:
    monkeypatch.setattr(early_exit, "q_score", lambda *a, **k: q)


async def run(cluster, cfg, hooks=None, mode="pipelined", question_id="q-1"):
    hooks = hooks or fake_hooks()
    async with RouterContext.open(cluster.spec) as ctx:
        session = Session(
            ctx, cfg, QUESTION, mode, on_completion=hooks(cfg), question_id=question_id
        )
        result = await asyncio.wait_for(session.run_all(), 20)
        pieces = build_pieces(ctx.tokenizer("smollm2"), cfg.template_of("final"), QUESTION)
        eot = ctx.tokenizer("smollm2").eot_ids
    hooks.close()
    return result, pieces, eot


def expected_prompt(result, pieces, eot, kept: list[str]) -> list[int]:
    ids = list(pieces.head)
    for pos, agent in enumerate(kept):
        ids += clean_output(result.trace[agent]["output_ids"], eot)
        ids += pieces.betweens[pos] if pos < len(kept) - 1 else pieces.tail
    return ids


def final_requests(cluster) -> tuple[list[list[int]], list[int]]:
    """(warm-ups, final prompt) the prefill worker got for agent `final`."""
    prefill = cluster.prefills[0]
    warm = [r[P.INPUT_IDS] for r in prefill.warmups() if "-final-" in r[P.RID]]
    final = [r[P.INPUT_IDS] for r in prefill.finals() if "-final-" in r[P.RID]]
    return warm, final[-1]


async def test_exit_after_the_warmed_region_keeps_warmups_valid(
    smollm_tokenizer_path,  # noqa: F811
    monkeypatch,
):
    force_q(monkeypatch, 1.0)
    cluster = await cluster_holding(smollm_tokenizer_path, hold=("leaf_0_1",))
    try:
        result, pieces, eot = await run(cluster, ee_config())
        killed = [d for d in result.early_exit if d["exited"]]
        assert len(result.early_exit) == 2 and len(killed) == 1
        assert killed[0]["killed"] == ["leaf_0_1"] and killed[0]["cluster"] == "final"
        assert sorted(killed[0]["completed"]) == ["leaf_0_0", "leaf_0_2"]
        assert all(set(d) == set(RECORD_KEYS) for d in result.early_exit)
        trace = result.trace
        assert trace["leaf_0_1"]["killed"] and not trace["leaf_0_1"]["output_ids"]
        assert trace["final"]["slot_order"] == ["leaf_0_0", "leaf_0_2"]
        # Aborted on both of its workers.
        rid = next(r[P.RID] for r in cluster.decodes[0].requests if "-leaf_0_1-" in r[P.RID])
        assert rid in cluster.prefills[0].aborted and rid in cluster.decodes[0].aborted
        warm, final = final_requests(cluster)
        assert final == expected_prompt(result, pieces, eot, ["leaf_0_0", "leaf_0_2"])
        # The dropped slot came after the warmed region: every warm-up is a prefix of the final
        # prompt, no warm-up after the drop, and the final request reused all of it.
        assert warm and all(final[: len(w)] == w for w in warm)
        assert trace["final"]["warmup_lengths"] == [len(w) for w in warm]
        assert trace["final"]["cached_tokens"] == len(warm[-1])
        for w in [*cluster.prefills, *cluster.decodes]:
            assert not w.active
    finally:
        await cluster.close()


async def test_exit_inside_the_warmed_region_rewarms_from_the_valid_prefix(
    smollm_tokenizer_path,  # noqa: F811
    monkeypatch,
):
    force_q(monkeypatch, 1.0)
    cluster = await cluster_holding(smollm_tokenizer_path)
    # leaf_0_0 (slot 1) streams long; its tokens are warmed before the other two finish.
    cfg = ee_config({"leaf_0_0": 400, "leaf_0_1": 12, "leaf_0_2": 12})
    try:
        result, pieces, eot = await run(cluster, cfg)
        exits = [d for d in result.early_exit if d["exited"]]
        assert exits and exits[0]["killed"] == ["leaf_0_0"]
        assert 0 < len(result.trace["leaf_0_0"]["output_ids"]) < 400
        warm, final = final_requests(cluster)
        assert final == expected_prompt(result, pieces, eot, ["leaf_0_1", "leaf_0_2"])
        stale = [w for w in warm if final[: len(w)] != w]
        assert stale, "some warm-up should have carried leaf_0_0's tokens"
        valid = max(common_prefix_len(w, final) for w in warm)
        # The prefill recomputes from the longest valid prefix: the static head, since slot 1
        # now holds another agent's output.
        assert valid == len(pieces.head)
        assert result.trace["final"]["cached_tokens"] == valid
        assert max(len(w) for w in warm) > valid
    finally:
        await cluster.close()


async def test_a_killed_aggregator_takes_its_unfinished_precursors_along(
    smollm_tokenizer_path,  # noqa: F811
    monkeypatch,
):
    force_q(monkeypatch, 1.0)
    held = ("leaf_2_0", "leaf_2_1", "leaf_2_2")
    cluster = await cluster_holding(smollm_tokenizer_path, hold=held)
    cfg = tree_config("tree_9_3_1_cpu", max_new_tokens=6)
    cfg = cfg.model_copy(update={"early_exit": EarlyExit(enabled=True)})
    try:
        result, _, _ = await run(cluster, cfg)
        final = [d for d in result.early_exit if d["cluster"] == "final" and d["exited"]]
        assert final and final[0]["killed"] == ["agg_2"]
        assert not [d for d in result.early_exit if d["cluster"] == "agg_2"]
        # Nobody reads leaf_2_* once agg_2 is gone: aborted, not left to time out.
        assert all(result.trace[a]["killed"] for a in ("agg_2", *held))
        assert result.trace["final"]["slot_order"] == ["agg_0", "agg_1"]
    finally:
        await cluster.close()


async def test_no_exit_at_q_zero_and_min_completed(smollm_tokenizer_path, monkeypatch):  # noqa: F811
    cluster = await cluster_holding(smollm_tokenizer_path)
    cfg = ee_config({"leaf_0_0": 4, "leaf_0_1": 8, "leaf_0_2": 12})
    try:
        force_q(monkeypatch, 0.0)
        result, _, _ = await run(cluster, cfg)
        ds = result.early_exit
        assert [d["completed"] for d in ds] == [
            ["leaf_0_0"],
            ["leaf_0_0", "leaf_0_1"],
            ["leaf_0_0", "leaf_0_1", "leaf_0_2"],
        ]
        assert not any(d["exited"] or d["killed"] for d in ds)
        assert ds[0]["q"] is None and ds[0]["u"] is None  # below min_completed: nothing computed
        assert ds[1]["q"] == 0.0 and 0.0 <= ds[1]["u"] < 1.0
        assert all(d["seconds"] > 0 for d in ds)
        assert result.trace["final"]["slot_order"] == ["leaf_0_0", "leaf_0_1", "leaf_0_2"]
        force_q(monkeypatch, 1.0)
        tokens = {"leaf_0_0": 4, "leaf_0_1": 8, "leaf_0_2": 12}
        result, _, _ = await run(cluster, ee_config(tokens, min_completed=3))
        assert not any(d["exited"] for d in result.early_exit)
        assert [d["q"] for d in result.early_exit][:2] == [None, None]
        assert not any(t["killed"] for t in result.trace.values())
    finally:
        await cluster.close()


async def test_dmv_exits_on_a_strict_majority(smollm_tokenizer_path):  # noqa: F811
    cluster = await cluster_holding(smollm_tokenizer_path, hold=("leaf_0_1",))
    cfg = ee_config(method="dmv", min_completed=1)
    try:
        result, _, _ = await run(cluster, cfg, fake_hooks(lambda text: "42"))
        ds = result.early_exit
        # One of three planned agreeing is no majority; two of three is.
        assert [(round(d["q"], 3), d["exited"]) for d in ds] == [(0.333, False), (0.667, True)]
        assert ds[1]["killed"] == ["leaf_0_1"] and ds[0]["c_bar"] is None
        assert result.trace["leaf_0_1"]["killed"]
    finally:
        await cluster.close()
    cluster = await cluster_holding(smollm_tokenizer_path)
    try:
        # The fake outputs end in different numbers: never a majority, every agent runs.
        result, _, _ = await run(cluster, cfg, fake_hooks())
        assert len(result.early_exit) == 3 and not any(d["exited"] for d in result.early_exit)
    finally:
        await cluster.close()


async def test_aggregator_bypass_passes_the_consensus_on(smollm_tokenizer_path):  # noqa: F811
    cluster = await cluster_holding(smollm_tokenizer_path, hold=("leaf_0_1",))
    cfg = ee_config(method="dmv", bypass={"enabled": True, "criterion": "answer"})
    try:
        result, _, _ = await run(cluster, cfg, fake_hooks(lambda text: "42"))
        final = result.trace["final"]
        assert final["bypassed"] and final["skipped"] and not final["killed"]
        # Equal confidences: the first agent of the agreeing set stands in.
        source = result.early_exit[-1]["completed"][0]
        assert result.answer == result.trace[source]["text"] != ""
        assert final["output_ids"] == result.trace[source]["output_ids"]
        # Bypassed before its prompt was complete: the final agent never reached decode.
        assert not [r for r in cluster.decodes[0].requests if "-final-" in r[P.RID]]
        assert activation_percentage([result.trace]) == {"smollm2": 50.0}
    finally:
        await cluster.close()


async def test_draws_replay_and_follow_the_seed(smollm_tokenizer_path):  # noqa: F811
    cluster = await cluster_holding(smollm_tokenizer_path)
    tokens = {"leaf_0_0": 4, "leaf_0_1": 8, "leaf_0_2": 12}

    def key(ds):
        return [(d["completed"], d["q"], d["u"], d["exited"], d["killed"]) for d in ds]

    try:
        runs = [(await run(cluster, ee_config(tokens, seed=s)))[0].early_exit for s in (7, 7, 8)]
        assert key(runs[0]) == key(runs[1])
        assert runs[0][1]["u"] is not None and runs[0][1]["u"] != runs[2][1]["u"]
        assert 0.0 < runs[0][1]["q"] < 1.0 and runs[0][1]["p"] is not None
    finally:
        await cluster.close()


async def test_a_failing_embedding_fails_the_question(smollm_tokenizer_path):  # noqa: F811
    """Early exit that raises does not quietly run the question as setting #3: the question
    fails, naming early exit and the cause (the runner records it as the row's error)."""
    cluster = await cluster_holding(smollm_tokenizer_path)
    cfg = ee_config({"leaf_0_0": 4, "leaf_0_1": 8, "leaf_0_2": 12})
    try:
        with pytest.raises(AgentFailed, match="early exit failed.*embedding kernel exploded"):
            await run(cluster, cfg, fake_hooks(embedder=BrokenEmbedder()))
        hooks = fake_hooks(embedder=BrokenEmbedder())
        client = TestClient(TestServer(make_app(cluster.spec, {cfg.name: cfg}, hooks)))
        await client.start_server()
        try:
            r = await client.post("/v1/moa/run", json={"question": QUESTION, "config": cfg.name})
            body = await r.json()
            assert r.status == 502 and "embedding kernel exploded" in body["message"]
            assert "trace" in body
        finally:
            await client.close()
    finally:
        await cluster.close()


async def test_an_exit_that_cuts_nothing_is_moot(smollm_tokenizer_path, monkeypatch):  # noqa: F811
    """The draw says exit, but the last agent finished while the decision waited for its
    embedding: recorded as moot, not as an exit, and nobody is marked killed."""
    force_q(monkeypatch, 1.0)
    cluster = await cluster_holding(smollm_tokenizer_path)
    cfg = ee_config({"leaf_0_0": 4, "leaf_0_1": 8, "leaf_0_2": 12})
    try:
        result, _, _ = await run(cluster, cfg, fake_hooks(embedder=SlowEmbedder(0.4)))
        ds = result.early_exit
        assert [d["moot"] for d in ds] == [False, True]
        assert ds[1]["q"] == 1.0 and not ds[1]["exited"] and ds[1]["killed"] == []
        # The first decision (below min_completed) did not wait for an embedding; the second
        # is charged both (each output's embedding once, to the first decision using it).
        assert ds[0]["seconds"] < 0.2 and ds[1]["seconds"] > 0.75 and ds[1]["wall_s"] > 0.3
        assert not any(t["killed"] for t in result.trace.values())
        assert result.trace["final"]["slot_order"] == ["leaf_0_0", "leaf_0_1", "leaf_0_2"]
    finally:
        await cluster.close()


def test_a_missing_embedding_model_only_disables_early_exit_where_no_config_enables_it(tmp_path):
    """A GPU node without the embedding package still serves #1-#3: with early exit off in every
    config, start-up warns instead of stopping, and a request that turns it on is refused."""
    broken = tmp_path / "broken-embedder"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    off = EarlyExit(enabled=False, embedding_model=str(broken))
    cfg = tree_config().model_copy(update={"early_exit": off})
    hooks = EarlyExitHooks()
    (warning,) = hooks.check([cfg])
    assert cfg.name in warning and str(broken) in warning
    assert hooks(cfg)._embeddings is None  # off: the question runs without an embedder
    on = cfg.model_copy(update={"early_exit": off.model_copy(update={"enabled": True})})
    with pytest.raises(ValueError, match="early exit is unavailable on this router"):
        hooks(on)


def test_a_broken_embedding_model_stops_the_router(tmp_path, smollm_tokenizer_path):  # noqa: F811
    """A model directory that resolves but cannot load stops `python -m router` at start-up
    (so `moa-pd up` fails) with a message naming the model and the directory."""
    broken = tmp_path / "broken-embedder"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    ee = EarlyExit(enabled=True, embedding_model=str(broken))
    cfg = tree_config().model_copy(update={"early_exit": ee})
    with pytest.raises(EmbedderError, match=f"looked for in {broken}"):
        EarlyExitHooks().check([cfg])
    (tmp_path / "cfg.json").write_text(cfg.model_dump_json())
    cluster = {
        "models": {
            "smollm2": {
                "router_url": "http://127.0.0.1:9",
                "prefill_urls": ["http://127.0.0.1:9"],
                "decode_urls": ["http://127.0.0.1:9"],
                "bootstrap_ports": [9],
                "model_path": smollm_tokenizer_path,
                "tokenizer_path": smollm_tokenizer_path,
            }
        }
    }
    (tmp_path / "cluster.json").write_text(json.dumps(cluster))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "router",
            "--cluster",
            str(tmp_path / "cluster.json"),
            "--config",
            str(tmp_path / "cfg.json"),
            "--port",
            str(free_port()),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"looked for in {broken}" in proc.stderr and "cannot serve early exit" in proc.stderr


def test_dmv_reads_answers_with_the_datasets_own_extractor():
    """The runner names the dataset: DMV votes on what that dataset's scorer would grade (a
    letter on MMLU-ProX-Lite, not the last number), and refuses a dataset with no answer."""
    cfg = ee_config(method="dmv")
    hooks = EarlyExitHooks()
    text = "Option (C) is right: 3 of the 4 facts hold. The answer is (C)."
    assert hooks(cfg)._extract(text) == "4"  # no dataset: the last number
    assert hooks(cfg, "mmlu_prox_lite")._extract(text) == "c"
    assert hooks(cfg, "gsm8k")._extract("so 3 + 4 = 7 apples. The answer is $1,234.") == "1234"
    assert hooks(cfg, "bbh", "navigate")._extract("So the answer is No.") == "no"
    with pytest.raises(ValueError, match="dataset 'ifbench' has no single answer"):
        hooks(cfg, "ifbench")
    bypass = ee_config(method="q", bypass={"enabled": True, "criterion": "answer"})
    with pytest.raises(ValueError, match="aggregator_bypass.criterion 'answer'"):
        hooks(bypass.model_copy(update={"early_exit": EarlyExit(enabled=False)}), "ifbench")
    hooks.close()


async def test_http_run_refuses_dmv_on_a_dataset_without_answers(smollm_tokenizer_path):  # noqa: F811
    cluster = await cluster_holding(smollm_tokenizer_path)
    cfg = ee_config(method="dmv")
    client = TestClient(TestServer(make_app(cluster.spec, {cfg.name: cfg})))
    await client.start_server()
    try:
        body = {"question": QUESTION, "config": cfg.name, "dataset": "ifbench"}
        r = await client.post("/v1/moa/run", json=body)
        msg = (await r.json())["message"]
        assert r.status == 400 and "ifbench" in msg and "early_exit.method 'q'" in msg
        r = await client.post("/v1/moa/run", json={**body, "dataset": 7})
        assert r.status == 400 and "dataset" in (await r.json())["message"]
        r = await client.post("/v1/moa/run", json={**body, "dataset": "gsm8k"})
        assert r.status == 200, await r.text()
    finally:
        await client.close()
        await cluster.close()


async def test_http_run_returns_decisions(smollm_tokenizer_path):  # noqa: F811
    cluster = await cluster_holding(smollm_tokenizer_path)
    cfg = ee_config(method="dmv")
    # The default hook: a dmv question needs no embedding model.
    client = TestClient(TestServer(make_app(cluster.spec, {cfg.name: cfg})))
    await client.start_server()
    try:
        body = {"question": QUESTION, "config": cfg.name, "question_id": "gsm8k-3"}
        r = await client.post("/v1/moa/run", json=body)
        assert r.status == 200, await r.text()
        out = await r.json()
        assert [set(d) for d in out["early_exit"]] == [set(RECORD_KEYS)] * 3
        r = await client.post("/v1/moa/run", json={**body, "early_exit": False})
        assert (await r.json())["early_exit"] == []
        r = await client.post("/v1/moa/run", json={**body, "question_id": [1]})
        assert r.status == 400 and "question_id" in (await r.json())["message"]
    finally:
        await client.close()
        await cluster.close()


@pytest.mark.slow
async def test_decisions_on_the_real_engine(stack):
    cfg = tree_config("tree_3_1_cpu", max_new_tokens=8)
    cfg = cfg.model_copy(update={"early_exit": EarlyExit(enabled=True)})
    hooks = EarlyExitHooks()
    try:
        async with RouterContext.open(stack_cluster(stack)) as ctx:
            session = Session(ctx, cfg, "What is 7 times 8?", "pipelined", on_completion=hooks(cfg))
            result = await session.run_all()
    finally:
        hooks.close()
    assert result.early_exit and all(set(d) == set(RECORD_KEYS) for d in result.early_exit)
    computed = [d for d in result.early_exit if d["q"] is not None]
    assert computed and all(0.0 <= d["q"] <= 1.0 and 0.0 < d["c_bar"] <= 1.0 for d in computed)
    assert result.answer
