"""BootstrapServer routes, over real HTTP on a free port."""

import aiohttp
import pytest

from sglang_ext.disagg import BootstrapServer


@pytest.fixture
def server():
    s = BootstrapServer("127.0.0.1", 0)
    yield s
    s.close()


async def test_health_and_routes(server):
    base = f"http://127.0.0.1:{server.port}"
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base}/health") as r:
            assert r.status == 200 and await r.text() == "OK"
        async with http.get(
            f"{base}/route?engine_rank=-1&target_dp_group=-1&target_pp_rank=-1"
        ) as r:
            assert r.status == 404  # nobody registered yet
        entry = {"role": "Prefill", "rank_ip": "127.0.0.1", "rank_port": 4242, "agent_name": "a"}
        async with http.put(f"{base}/route", json=entry) as r:
            assert r.status == 200
        async with http.get(f"{base}/route?engine_rank=0&target_dp_group=0&target_pp_rank=0") as r:
            got = await r.json()
            assert (got["rank_ip"], got["rank_port"], got["agent_name"]) == ("127.0.0.1", 4242, "a")
        async with http.get(
            f"{base}/route?engine_rank=-1&target_dp_group=-1&target_pp_rank=-1"
        ) as r:
            assert await r.json() == {
                "prefill_attn_tp_size": 1,
                "prefill_dp_size": 1,
                "prefill_pp_size": 1,
            }
        async with http.get(f"{base}/route?engine_rank=1&target_dp_group=0&target_pp_rank=0") as r:
            assert r.status == 404 and "engine_rank=1" in (await r.json())["error"]["message"]


async def test_bad_requests(server):
    base = f"http://127.0.0.1:{server.port}"
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base}/route") as r:
            assert r.status == 400
        async with http.put(f"{base}/route", json={"rank_ip": "x"}) as r:
            assert r.status == 400 and "rank_port" in (await r.json())["error"]["message"]
        async with http.put(
            f"{base}/route", json={"role": "Decode", "rank_ip": "x", "rank_port": 1}
        ) as r:
            assert r.status == 400


def test_port_in_use_says_how_to_fix(server):
    with pytest.raises(OSError, match="its own --disaggregation-bootstrap-port"):
        BootstrapServer("127.0.0.1", server.port)
