"""The control channel from decode to a prefill rank: a destination per room, or an abort.

SGLang sends these over ZMQ; here they are two JSON routes on the prefill KVManager's control
listener (`POST /kv_dest`, `POST /kv_abort`) and the client calls decode's KVReceiver makes.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from sglang_ext.disagg.loop_thread import LoopThread
from sglang_ext.disagg.ranges import Range
from sglang_ext.protocol import BOOTSTRAP_ROOM, error_body

logger = logging.getLogger(__name__)

# How long /kv_abort waits for a WRITE in flight to be released before answering 503.
ABORT_RELEASE_WAIT_S = 5.0


class ControlError(RuntimeError):
    """A non-200 answer on the control channel; `status` tells a refusal (4xx) from a fault."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class Destination:
    """Where decode wants one room's KV: its NIXL agent and its pages' byte ranges."""

    room: int
    agent_name: str
    agent_metadata: bytes
    dst_ranges: list[Range]

    def to_json(self) -> dict:
        return {
            BOOTSTRAP_ROOM: self.room,
            "agent_name": self.agent_name,
            "agent_metadata": base64.b64encode(self.agent_metadata).decode(),
            "dst_ranges": self.dst_ranges,
        }

    @classmethod
    def from_json(cls, d: dict) -> Destination:
        return cls(
            room=int(d[BOOTSTRAP_ROOM]),
            agent_name=str(d["agent_name"]),
            agent_metadata=base64.b64decode(d["agent_metadata"]),
            dst_ranges=[(int(a), int(n)) for a, n in d["dst_ranges"]],
        )


class ControlListener:
    """Serves the two routes on host (free port, see .port) on the given loop thread.

    `on_destination` returns None when it takes the destination, else the reason it refuses it
    (answered 409). `on_abort` records that decode gave up a room and returns an Event to wait
    for (the release of a WRITE in flight) before answering, or None.
    """

    def __init__(
        self,
        loop: LoopThread,
        host: str,
        on_destination: Callable[[Destination], str | None],
        on_abort: Callable[[int], threading.Event | None],
    ) -> None:
        self._loop = loop
        self._on_destination = on_destination
        self._on_abort = on_abort
        app = web.Application(client_max_size=256 * 1024**2)  # ~60k ranges per long prompt
        app.router.add_post("/kv_dest", self._handle_dest)
        app.router.add_post("/kv_abort", self._handle_abort)
        self._runner = web.AppRunner(app, access_log=None)
        self.port = loop.run(self._start(host), timeout=10)

    async def _start(self, host: str) -> int:
        await self._runner.setup()
        await web.TCPSite(self._runner, host, 0).start()
        return self._runner.addresses[0][1]

    async def _handle_dest(self, request: web.Request) -> web.Response:
        try:
            dest = Destination.from_json(await request.json())
        except (ValueError, KeyError, TypeError) as e:
            msg = f"POST /kv_dest needs {BOOTSTRAP_ROOM}, agent_name, agent_metadata, dst_ranges: {e!r}"
            return web.json_response(error_body(msg, 400), status=400)
        refused = self._on_destination(dest)
        if refused is not None:
            return web.json_response(error_body(refused, 409), status=409)
        return web.json_response({"ok": True})

    async def _handle_abort(self, request: web.Request) -> web.Response:
        try:
            room = int((await request.json())[BOOTSTRAP_ROOM])
        except (ValueError, KeyError, TypeError) as e:
            return web.json_response(
                error_body(f"POST /kv_abort needs {BOOTSTRAP_ROOM}: {e!r}", 400), status=400
            )
        released = self._on_abort(room)
        if released is not None:  # answer once no byte of the room's WRITE can still land
            loop = asyncio.get_running_loop()
            if not await loop.run_in_executor(None, released.wait, ABORT_RELEASE_WAIT_S):
                msg = f"room {room}: its KV WRITE was not released within {ABORT_RELEASE_WAIT_S} s"
                return web.json_response(error_body(msg, 503), status=503)
        return web.json_response({"ok": True})

    def close(self) -> None:
        self._loop.run(self._runner.cleanup(), timeout=5)


async def post_destination(session: aiohttp.ClientSession, url: str, dest: Destination) -> None:
    async with session.post(f"{url}/kv_dest", json=dest.to_json()) as resp:
        if resp.status != 200:
            raise ControlError(
                f"POST {url}/kv_dest -> {resp.status}: {await resp.text()}", resp.status
            )


async def post_abort(session: aiohttp.ClientSession, url: str, room: int) -> None:
    async with session.post(f"{url}/kv_abort", json={BOOTSTRAP_ROOM: room}) as resp:
        if resp.status != 200:
            raise ControlError(
                f"POST {url}/kv_abort -> {resp.status}: {await resp.text()}", resp.status
            )
