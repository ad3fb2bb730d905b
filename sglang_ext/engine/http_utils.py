"""Shared pieces of the worker's HTTP routes: app keys, JSON bodies and errors, and the async
iterator that hands a Req to the engine and yields its OutputChunks (aborting it when the client
goes away). Used by `server.py` and `openai_api.py`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import web

from sglang_ext import protocol as P
from sglang_ext.engine.request import BadRequestError, OutputChunk, Req

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class WorkerState:
    """Filled at startup (the app is frozen by then, so the state object is mutated instead)."""

    args: object
    engine: object = None
    tokenizer: object = None
    model_dir: str | None = None  # the resolved local model directory


STATE = web.AppKey("state", WorkerState)

# How often a waiting handler checks that its client is still connected.
DISCONNECT_POLL_S = 0.5


def error(status: int, message: str) -> web.Response:
    return web.json_response(P.error_body(message, status), status=status)


async def json_body(request: web.Request) -> dict:
    """The request's JSON object; BadRequestError (→ 400) for malformed JSON."""
    try:
        raw = await request.read()
        return json.loads(raw) if raw else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequestError(f"malformed JSON body: {e}") from None


def client_gone(request: web.Request | None) -> bool:
    return request is not None and (request.transport is None or request.transport.is_closing())


async def iter_outputs(engine, req: Req, request: web.Request | None) -> AsyncIterator[OutputChunk]:
    """Submit `req` and yield its chunks until finished. Leaving early (client disconnect, a write
    error, cancellation) aborts the request so its pages are freed."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue[OutputChunk] = asyncio.Queue()
    req.on_output = lambda c: loop.call_soon_threadsafe(q.put_nowait, c)
    engine.submit(req)
    finished = False
    try:
        while True:
            try:
                chunk = await asyncio.wait_for(q.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if client_gone(request):
                    logger.info("rid=%s: client disconnected, aborting", req.rid)
                    return
                continue
            while not chunk.finished and not q.empty():  # coalesce chunks that piled up
                nxt = q.get_nowait()
                nxt.new_ids = chunk.new_ids + nxt.new_ids
                nxt.new_logprobs = chunk.new_logprobs + nxt.new_logprobs
                nxt.new_top_logprobs = chunk.new_top_logprobs + nxt.new_top_logprobs
                chunk = nxt
            finished = chunk.finished
            yield chunk
            if finished:
                return
    finally:
        if not finished:
            engine.abort(req.rid, "client disconnected")
