"""The shell router's health watch: a worker that is gone, hung or exited is noticed in seconds;
requests that need it fail at once naming it and its log; /health turns 503; a question in
flight when its worker goes down fails instead of waiting for a read timeout."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from router.cluster import ClusterSpec, create_time
from router.health_watch import HealthWatch, WorkerDown
from router.server import make_app
from tests.router_fixtures import smollm_tokenizer_path, start_fake_cluster, tree_config  # noqa: F401


async def _server(health) -> TestServer:
    app = web.Application()
    app.router.add_get("/health", health)
    server = TestServer(app)
    await server.start_server()
    return server


def _url(server: TestServer) -> str:
    return str(server.make_url("")).rstrip("/")


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({})


async def _hang(request: web.Request) -> web.Response:
    await asyncio.sleep(30)
    return web.json_response({})


def _cluster(prefill: str, decode: str, router: str, processes: dict | None = None) -> ClusterSpec:
    return ClusterSpec.model_validate(
        {
            "models": {
                "m": {
                    "router_url": router,
                    "prefill_urls": [prefill],
                    "decode_urls": [decode],
                    "tokenizer_path": "unused",
                    "processes": processes or {},
                }
            }
        }
    )


async def _until(pred, timeout: float = 5.0) -> float:
    t0 = time.monotonic()
    while not pred():
        assert time.monotonic() - t0 < timeout, "condition not met in time"
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])


def _kill(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


async def test_gone_hung_and_exited_processes_are_down_and_named():
    alive, hung, gone = await _server(_ok), await _server(_hang), await _server(_ok)
    # n's decode answers /health, but its recorded process exits: the pid check notices.
    exited = await _server(_ok)
    gone_url = _url(gone)
    await gone.close()
    sleeper = _sleeper()
    exited_url = _url(exited)
    spec = ClusterSpec.model_validate(
        {
            "models": {
                "m": {
                    "router_url": _url(alive),
                    "prefill_urls": [_url(hung)],
                    "decode_urls": [gone_url],
                    "tokenizer_path": "unused",
                    "processes": {gone_url: {"name": "m.decode0", "log": "/logs/m.decode0.log"}},
                },
                "n": {
                    "router_url": _url(alive),
                    "prefill_urls": [_url(alive)],
                    "decode_urls": [exited_url],
                    "tokenizer_path": "unused",
                    "processes": {
                        exited_url: {
                            "name": "n.decode0",
                            "pid": sleeper.pid,
                            "create_time": create_time(sleeper.pid),
                        }
                    },
                },
            }
        }
    )
    watch = HealthWatch(spec, interval_s=0.05, timeout_s=0.2)
    task = asyncio.create_task(watch.run())
    try:
        await _until(lambda: any(e.role == "decode0" for e in watch.down({"m"})))
        with pytest.raises(
            WorkerDown,
            match=r"m decode0 .* is down \(/health unreachable.*"
            r"its log: /logs/m.decode0.log",
        ):
            watch.check({"m"})
        watch.check({"n"})  # nothing of n is down yet
        _kill(sleeper)
        await _until(lambda: watch.down({"n"}))
        assert "exited" in watch.down({"n"})[0].down
        await _until(lambda: len(watch.down({"m"})) == 2)
        assert "hung" in next(e for e in watch.down({"m"}) if e.role == "prefill0").down
        assert {e.role for e in watch.down()} == {"decode0", "prefill0"}
    finally:
        task.cancel()
        await asyncio.wait([task])
        _kill(sleeper)
        await alive.close()
        await exited.close()
        await hung.close()


async def test_router_fails_fast_when_a_worker_goes_down(smollm_tokenizer_path):  # noqa: F811
    """In flight: the question fails within seconds (not the 300 s read timeout), naming the
    worker; afterwards: new questions are a 503 at once and /health is 503 "degraded"."""
    cluster = await start_fake_cluster(smollm_tokenizer_path)
    cfg = tree_config(max_new_tokens=6)
    client = TestClient(TestServer(make_app(cluster.spec, {cfg.name: cfg})))
    await client.start_server()
    try:
        assert (await client.get("/health")).status == 200
        cluster.decodes[0].hang = True  # every generation now waits forever
        msgs = [{"role": "user", "content": "2+3?"}]
        inflight = asyncio.create_task(
            client.post("/v1/chat/completions", json={"model": cfg.name, "messages": msgs})
        )
        await _until(lambda: cluster.decodes[0].active)
        t0 = time.monotonic()
        # Nothing listens there any more, as after a kill -9 (site.stop() would also wait for
        # the open connections to end).
        next(iter(cluster.decodes[0].server.runner.sites))._server.close()
        r = await asyncio.wait_for(inflight, 10)
        assert r.status == 502 and time.monotonic() - t0 < 5
        assert "decode0" in (await r.json())["error"]["message"]
        r = await client.post("/v1/moa/run", json={"question": "q", "config": cfg.name})
        assert r.status == 503 and "smollm2 decode0" in (await r.json())["error"]["message"]
        r = await client.get("/health")
        body = await r.json()
        assert r.status == 503 and body["status"] == "degraded"
        assert [d["role"] for d in body["down"]] == ["decode0"]
    finally:
        cluster.decodes[0].hang = False
        for rid in list(cluster.decodes[0].active):
            cluster.decodes[0].active[rid].set()
        await client.close()
        await cluster.close()
