"""BootstrapServer: the rendezvous registry on a prefill worker, plus its two client calls.

Routes as SGLang's CommonKVBootstrapServer: prefill ranks `PUT /route` their control address,
decode `GET /route` to find the rank of a request, `GET /health`. KV never passes through it.
Started by the prefill KVManager; `get_route` is called by decode's KVReceiver.
"""

from __future__ import annotations

import logging

import aiohttp
from aiohttp import web

from sglang_ext.disagg.loop_thread import LoopThread
from sglang_ext.protocol import error_body

logger = logging.getLogger(__name__)

ROLE_PREFILL = "Prefill"
_SIZE_KEYS = {"attn_tp_size": 1, "attn_dp_size": 1, "pp_size": 1}
_RANK_KEYS = {"attn_tp_rank": 0, "attn_dp_rank": 0, "pp_rank": 0}


def _error(message: str, status: int) -> web.Response:
    return web.json_response(error_body(message, status), status=status)


class BootstrapServer:
    """aiohttp registry on host:port in a daemon thread; port 0 picks a free port (see .port)."""

    def __init__(self, host: str, port: int, *, loop: LoopThread | None = None) -> None:
        self.host = host
        self._own_loop = loop is None
        self._loop = loop or LoopThread(f"bootstrap-{port}")
        # dp_group -> attn_tp_rank -> pp_rank -> {"rank_ip", "rank_port", extras}
        self.prefill_port_table: dict[int, dict[int, dict[int, dict]]] = {}
        self.sizes: dict[str, int] = {}
        self._runner: web.AppRunner | None = None
        try:
            self.port = self._loop.run(self._start(host, port), timeout=10)
        except OSError as e:
            self._stop_loop()
            raise OSError(
                f"bootstrap server cannot bind {host}:{port} ({e}); give each prefill worker "
                "its own --disaggregation-bootstrap-port"
            ) from e
        logger.info("bootstrap server on %s:%d", host, self.port)

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_put("/route", self._handle_route_put)
        app.router.add_get("/route", self._handle_route_get)
        app.router.add_get("/health", self._handle_health)
        return app

    async def _start(self, host: str, port: int) -> int:
        self._runner = web.AppRunner(self.make_app(), access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        return self._runner.addresses[0][1]

    async def _handle_health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def _handle_route_put(self, request: web.Request) -> web.Response:
        try:
            data = await request.json()
            role = data.get("role", ROLE_PREFILL)
            rank_ip, rank_port = str(data["rank_ip"]), int(data["rank_port"])
            ranks = {k: int(data.get(k, v)) for k, v in _RANK_KEYS.items()}
            sizes = {k: int(data.get(k, v)) for k, v in _SIZE_KEYS.items()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            return _error(f"PUT /route needs a JSON object with rank_ip and rank_port: {e!r}", 400)
        if role != ROLE_PREFILL:
            return _error(f"only role {ROLE_PREFILL!r} registers here, got {role!r}", 400)
        self.sizes = sizes
        entry = {**data, "rank_ip": rank_ip, "rank_port": rank_port}
        group = self.prefill_port_table.setdefault(ranks["attn_dp_rank"], {})
        group.setdefault(ranks["attn_tp_rank"], {})[ranks["pp_rank"]] = entry
        logger.info("registered prefill rank %s at %s:%d", ranks, rank_ip, rank_port)
        return web.Response(text="OK")

    async def _handle_route_get(self, request: web.Request) -> web.Response:
        q = request.query
        if "engine_rank" not in q:
            return _error("GET /route needs ?engine_rank=&target_dp_group=&target_pp_rank=", 400)
        try:
            rank = int(q["engine_rank"])
            group = int(q.get("target_dp_group", 0))
            pp_rank = int(q.get("target_pp_rank", 0))
        except ValueError as e:
            return _error(f"GET /route query values must be integers: {e}", 400)
        if rank == group == pp_rank == -1:  # SGLang's "tell me the prefill layout" query
            if not self.sizes:
                return _error("no prefill rank has registered yet", 404)
            return web.json_response(
                {
                    "prefill_attn_tp_size": self.sizes["attn_tp_size"],
                    "prefill_dp_size": self.sizes["attn_dp_size"],
                    "prefill_pp_size": self.sizes["pp_size"],
                }
            )
        entry = self.prefill_port_table.get(group, {}).get(rank, {}).get(pp_rank)
        if entry is None:
            return _error(
                f"no prefill rank registered for engine_rank={rank} target_dp_group={group} "
                f"target_pp_rank={pp_rank}",
                404,
            )
        return web.json_response(entry)

    def _stop_loop(self) -> None:
        if self._own_loop:
            self._loop.stop()

    def close(self) -> None:
        if self._runner is not None:
            self._loop.run(self._runner.cleanup(), timeout=5)
            self._runner = None
        self._stop_loop()


async def put_route(session: aiohttp.ClientSession, bootstrap_addr: str, entry: dict) -> None:
    """Register one prefill rank (`entry` holds rank_ip, rank_port and the sizes/ranks)."""
    async with session.put(f"http://{bootstrap_addr}/route", json=entry) as resp:
        if resp.status != 200:
            raise RuntimeError(
                f"PUT http://{bootstrap_addr}/route -> {resp.status}: {await resp.text()}"
            )


async def get_route(
    session: aiohttp.ClientSession,
    bootstrap_addr: str,
    engine_rank: int = 0,
    dp_group: int = 0,
    pp_rank: int = 0,
) -> dict:
    """Look up a prefill rank: {"rank_ip", "rank_port", ...}; raises on any failure."""
    url = (
        f"http://{bootstrap_addr}/route?engine_rank={engine_rank}"
        f"&target_dp_group={dp_group}&target_pp_rank={pp_rank}"
    )
    async with session.get(url) as resp:
        if resp.status != 200:
            raise RuntimeError(f"GET {url} -> {resp.status}: {await resp.text()}")
        return await resp.json()
