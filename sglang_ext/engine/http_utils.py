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

# How often a waiting handler checks that its client is still connected (and the engine alive).
DISCONNECT_POLL_S = 0.5
# Bound on handlers' calls into the engine thread (stats, flush, abort): it runs them between
# steps, so this must exceed the longest step (a big prefill on a loaded CPU).
ENGINE_CALL_TIMEOUT_S = 60.0


def error(status: int, message: str) -> web.Response:
    return web.json_response(P.error_body(message, status), status=status)


async def json_body(request: web.Request) -> dict:
    """The request's JSON object; BadRequestError (→ 400) for malformed JSON or another value."""
    try:
        raw = await request.read()
        body = json.loads(raw) if raw else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequestError(f"malformed JSON body: {e}") from None
    if not isinstance(body, dict):
        raise BadRequestError(f"the request body must be a JSON object, not {type(body).__name__}")
    return body


def client_gone(request: web.Request | None) -> bool:
    return request is not None and (request.transport is None or request.transport.is_closing())


async def iter_outputs(engine, req: Req, request: web.Request | None) -> AsyncIterator[OutputChunk]:
    """Submit `req` and yield its chunks until finished. Leaving early (client disconnect, a write
    error, cancellation) aborts the request so its pages are freed; a dead engine thread ends it
    with a 500 instead of a hang."""
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
                if not engine.alive:
                    finished = True  # nothing left to abort
                    yield _engine_dead(req)
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
            # A non-streaming client that left is seen here too, while tokens still flow.
            if client_gone(request):
                logger.info("rid=%s: client disconnected, aborting", req.rid)
                return
    finally:
        if not finished:
            engine.abort_req(req, "client disconnected")


def _engine_dead(req: Req) -> OutputChunk:
    msg = "the engine loop is not running (see the worker log); restart the worker"
    return OutputChunk(
        [], [], [], req.prompt_len, 0, 0, {"type": P.FINISH_ABORT, "message": msg}, 500
    )


async def engine_call(engine, fn, timeout: float = ENGINE_CALL_TIMEOUT_S):
    """Run `fn` in the engine thread and await it, bounded (a dead or stuck loop → TimeoutError)."""
    return await asyncio.wait_for(asyncio.wrap_future(engine.call(fn)), timeout)
