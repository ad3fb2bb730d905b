"""The real-SGLang patch without SGLang: version -> plan, refusal, the Req hook, the route glue."""

import sys
import types
from pathlib import Path

import pytest

from sglang_ext import protocol as P
from sglang_ext.patch import UnsupportedSGLangVersion, dp_rank_field, patch_plan
from sglang_ext.patch import warmup_radix as W
from sglang_ext.patch.apply import PatchNotReachable, check_plugin_reachable
from sglang_ext.sglang_backend import worker

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("version", ["0.5.3", "0.5.8", "0.5.10", "0.5.10.post1"])
def test_before_0_5_11_only_the_route_is_needed(version):
    assert [p.name for p in patch_plan(version)] == ["prefill_only_route"]
    assert dp_rank_field(version) == "data_parallel_rank"


@pytest.mark.parametrize("version", ["0.5.11", "0.5.17", "0.5.23", "0.5.23.post1"])
def test_from_0_5_11_the_warmup_insert_runs_in_the_schedulers(version):
    plan = patch_plan(version)
    assert [(p.name, p.process) for p in plan] == [
        ("prefill_only_route", "main"),
        ("warmup_radix_insert", "scheduler"),
    ]
    assert dp_rank_field(version) == P.ROUTED_DP_RANK


@pytest.mark.parametrize("version", ["0.4.9", "0.5.2", "0.5.24", "0.6.0", "1.0", "not-a-version"])
def test_versions_outside_the_range_are_refused(version):
    with pytest.raises(UnsupportedSGLangVersion, match=r"0\.5\.3|cannot parse"):
        patch_plan(version)


def test_worker_refuses_an_unsupported_install_before_importing_sglang(monkeypatch, capsys):
    monkeypatch.setattr(worker, "installed_version", lambda: "0.5.30")
    assert worker.main(["--model-path", "m"]) == 2
    err = capsys.readouterr().err
    assert "0.5.30 is not supported" in err and "0.5.3 to 0.5.23" in err
    assert "sglang.srt" not in sys.modules


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["--tokenizer-worker-num", "2"], {}, "tokenizer-worker-num"),
        (["--tokenizer-worker-num=4"], {}, "tokenizer-worker-num"),
        ([], {"SGLANG_RUST_SERVER": "1"}, "SGLANG_RUST_SERVER"),
        (["--grpc-mode"], {}, "no HTTP app"),
    ],
)
def test_options_that_would_hide_the_route_are_refused(args, env, needle):
    with pytest.raises(worker.UnsupportedOption, match=needle):
        worker.check_options(args, env)


def test_plain_options_pass():
    worker.check_options(["--tokenizer-worker-num", "1", "--port", "30000"], {})


class FakeReq:
    """Just the attributes SGLang's Req.__init__ sets that the hook reads (0.5.23 names)."""

    def __init__(self, rid, bootstrap_host, positional_embed_overrides=None):
        self.rid = rid
        self.bootstrap_host = bootstrap_host
        self.positional_embed_overrides = positional_embed_overrides
        # What 0.5.11..0.5.23 compute in Req.__init__.
        self.skip_radix_cache_insert = (
            bootstrap_host == P.FAKE_BOOTSTRAP_HOST or positional_embed_overrides is not None
        )


@pytest.mark.parametrize(
    ("rid", "host", "overrides", "skip_after"),
    [
        (P.WARMUP_RID_PREFIX + "a", P.FAKE_BOOTSTRAP_HOST, None, False),  # our warm-up: cached
        ("sglang-warmup", P.FAKE_BOOTSTRAP_HOST, None, True),  # SGLang's own: left alone
        (P.WARMUP_RID_PREFIX + "a", P.FAKE_BOOTSTRAP_HOST, object(), True),  # KV not from ids
        (P.WARMUP_RID_PREFIX + "a", "10.0.0.1", None, False),  # real PD request: never skipped
        (P.WARMUP_RID_PREFIX + "a", "10.0.0.1", object(), True),
    ],
)
def test_after_req_init_only_undoes_the_fake_host_reason(rid, host, overrides, skip_after):
    req = FakeReq(rid, host, overrides)
    assert W.after_req_init(None, req, rid, "prompt") is None
    assert req.skip_radix_cache_insert is skip_after


def test_hook_leaves_a_req_without_the_new_attributes_alone():
    # 0.5.11's Req has no positional_embed_overrides; a missing rid must not crash the scheduler.
    req = types.SimpleNamespace(
        rid=None, bootstrap_host=P.FAKE_BOOTSTRAP_HOST, skip_radix_cache_insert=True
    )
    W.after_req_init(None, req)
    assert req.skip_radix_cache_insert is True


def test_plugin_is_inert_unless_moa_pd_launched_the_server(monkeypatch):
    monkeypatch.delenv(W.ENABLE_ENV, raising=False)
    W.register_plugin()  # must not import sglang (not installed here)
    assert "sglang.srt.plugins.hook_registry" not in sys.modules


def _fake_sglang(monkeypatch, fake_host=P.FAKE_BOOTSTRAP_HOST):
    """Stand-ins for the two SGLang modules register_plugin imports (their 0.5.23 names)."""
    calls = []

    class HookRegistry:
        @classmethod
        def register(cls, target, hook, hook_type):
            calls.append((target, hook, hook_type))

    registry = types.ModuleType("sglang.srt.plugins.hook_registry")
    registry.HookRegistry = HookRegistry
    registry.HookType = types.SimpleNamespace(AFTER="after")
    utils = types.ModuleType("sglang.srt.disaggregation.utils")
    utils.FAKE_BOOTSTRAP_HOST = fake_host
    for name in ("sglang", "sglang.srt", "sglang.srt.plugins", "sglang.srt.disaggregation"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, registry.__name__, registry)
    monkeypatch.setitem(sys.modules, utils.__name__, utils)
    return calls


def test_plugin_registers_an_after_hook_on_req_init(monkeypatch):
    calls = _fake_sglang(monkeypatch)
    monkeypatch.setenv(W.ENABLE_ENV, "1")
    W.register_plugin()
    assert calls == [("sglang.srt.managers.schedule_batch.Req.__init__", W.after_req_init, "after")]


def test_plugin_refuses_a_changed_fake_host(monkeypatch):
    _fake_sglang(monkeypatch, fake_host="3.3.3.3")
    monkeypatch.setenv(W.ENABLE_ENV, "1")
    with pytest.raises(RuntimeError, match="3.3.3.3"):
        W.register_plugin()


def _ep(name, value):
    return types.SimpleNamespace(name=name, value=value)


def test_plugin_reachability_check():
    ours = _ep(W.ENTRY_POINT_NAME, W.ENTRY_POINT_VALUE)
    check_plugin_reachable({}, lambda group: [ours])
    check_plugin_reachable({"SGLANG_PLUGINS": f"other, {W.ENTRY_POINT_NAME}"}, lambda g: [ours])
    with pytest.raises(PatchNotReachable, match="pip install -e"):
        check_plugin_reachable({}, lambda group: [])
    with pytest.raises(PatchNotReachable, match="pip install -e"):
        check_plugin_reachable({}, lambda group: [_ep(W.ENTRY_POINT_NAME, "elsewhere:fn")])
    with pytest.raises(PatchNotReachable, match="SGLANG_PLUGINS"):
        check_plugin_reachable({"SGLANG_PLUGINS": "other"}, lambda group: [ours])


def test_pyproject_declares_the_scheduler_plugin():
    # SGLang finds the hook in its spawned schedulers only through this entry point.
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    group = meta["project"].get("entry-points", {}).get(W.ENTRY_POINT_GROUP, {})
    assert group.get(W.ENTRY_POINT_NAME) == W.ENTRY_POINT_VALUE


# --- the route glue, on a FastAPI app standing in for SGLang's http_server.app -------------------


def _client_and_app(dp_field=P.ROUTED_DP_RANK, status=200, reply=None):
    fastapi = pytest.importorskip("fastapi")
    try:
        import httpx
    except ImportError:
        httpx = pytest.importorskip("httpx2")
    from sglang_ext.patch.prefill_only_route import install

    app, seen = fastapi.FastAPI(), []

    @app.post("/generate")
    async def generate(request: fastapi.Request):
        body = await request.json()
        seen.append((body, request.headers.get("authorization")))
        meta = {
            P.META_ID: body.get(P.RID),
            P.PROMPT_TOKENS: len(body[P.INPUT_IDS]),
            P.CACHED_TOKENS: 2,
            P.E2E_LATENCY: 0.01,
        }
        return fastapi.responses.JSONResponse(
            reply if reply is not None else {P.OUTPUT_IDS: [9], P.META_INFO: meta}, status
        )

    install(app, dp_field)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
    return client, seen


async def test_route_runs_a_fake_host_generate_in_process():
    client, seen = _client_and_app()
    async with client:
        resp = await client.post(
            P.PREFILL_ONLY_PATH,
            json={"input_ids": [1, 2, 3], "rid": "r"},
            headers={"Authorization": "Bearer k"},
        )
    assert resp.status_code == 200
    assert resp.json()[P.CACHED_TOKENS] == 2 and resp.json()[P.PROMPT_TOKENS] == 3
    body, auth = seen[0]
    assert body[P.BOOTSTRAP_HOST] == P.FAKE_BOOTSTRAP_HOST and body[P.RID] == "moa-warm-r"
    assert auth == "Bearer k"  # an --api-key server accepts the inner call too


async def test_route_uses_the_versions_dp_field_and_reports_errors():
    client, seen = _client_and_app(dp_field="data_parallel_rank")
    async with client:
        ok = await client.post(P.PREFILL_ONLY_PATH, json={"input_ids": [1], "routed_dp_rank": 1})
        bad = await client.post(P.PREFILL_ONLY_PATH, json={"input_ids": "x"})
        junk = await client.post(
            P.PREFILL_ONLY_PATH, content=b"{nope", headers={"content-type": "application/json"}
        )
    assert ok.status_code == 200 and seen[0][0]["data_parallel_rank"] == 1
    assert bad.status_code == 400 and "input_ids" in bad.json()["message"]
    assert junk.status_code == 400 and "not valid JSON" in junk.json()["message"]
    assert len(seen) == 1


async def test_route_passes_a_generate_error_through():
    client, _ = _client_and_app(status=400, reply=P.error_body("no bootstrap room", 400))
    async with client:
        resp = await client.post(P.PREFILL_ONLY_PATH, json={"input_ids": [1]})
    assert resp.status_code == 400 and resp.json()["message"] == "no bootstrap room"
