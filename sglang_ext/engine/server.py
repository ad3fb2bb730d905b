"""The worker's aiohttp app (`make_app(args)`): SGLang's native routes over one Engine.

Started by `sglang_ext.engine.launch.main`; tests call `make_app` with their own args. The OpenAI
routes live in `openai_api.py`, the metrics collector in `metrics.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from aiohttp import web

from sglang_ext import protocol as P
from sglang_ext.engine import openai_api
from sglang_ext.engine.generate_io import ReplyBuilder, parse_generate
from sglang_ext.engine.http_utils import (
    STATE,
    WorkerState,
    engine_call,
    error,
    iter_outputs,
    json_body,
)
from sglang_ext.engine.metrics import add_metrics_route
from sglang_ext.engine.request import BadRequestError, Req, SamplingParams
from sglang_ext.server_args import ServerArgs

logger = logging.getLogger(__name__)
VERSION = "0.5.3-torch"  # SGLang protocol version we follow, marked as this backend
MAX_BODY_BYTES = 64 * 1024 * 1024  # a longer body is a 413


async def serve(
    request: web.Request, req: Req, stream: bool, text_in_logprobs: bool = False
) -> web.StreamResponse:
    """Run `req` and answer as SGLang's /generate does (JSON, or SSE when `stream`)."""
    engine, tok = request.app[STATE].engine, request.app[STATE].tokenizer
    out = ReplyBuilder(req, tok, text_in_logprobs)
    resp: web.StreamResponse | None = None
    async with contextlib.aclosing(iter_outputs(engine, req, request)) as chunks:
        async for chunk in chunks:
            out.add(chunk)
            if chunk.status != 200 and resp is None:
                return error(chunk.status, chunk.finish_reason.get("message", "request failed"))
            if not stream:
                continue
            try:
                if resp is None:
                    resp = web.StreamResponse(
                        headers={"Content-Type": P.SSE_CONTENT_TYPE, "Cache-Control": "no-cache"}
                    )
                    await resp.prepare(request)
                if chunk.status != 200:
                    await resp.write(
                        P.sse_error(chunk.finish_reason.get("message", ""), chunk.status)
                    )
                else:
                    await resp.write(P.sse_event(out.stream_chunk()))
                if chunk.finished:
                    await resp.write(P.sse_done())
            except (ConnectionResetError, ConnectionError):
                logger.info("rid=%s: stream write failed, client gone", req.rid)
                return resp
    if resp is not None:
        return resp
    if out.last is None:  # client left before anything came back
        return error(499, "client disconnected")
    return web.json_response(out.reply())


async def generate(request: web.Request) -> web.StreamResponse:
    try:
        body = await json_body(request)
        req, stream = parse_generate(
            body, request.app[STATE].engine.cfg, request.app[STATE].tokenizer
        )
    except BadRequestError as e:
        return error(400, str(e))
    return await serve(request, req, stream, bool(body.get(P.RETURN_TEXT_IN_LOGPROBS)))


async def prefill_only(request: web.Request) -> web.Response:
    """Our warm-up verb: the same code as the route the patch mounts on real SGLang
    (sglang_ext.prefill_only.serve), over this engine's own /generate path."""
    import json

    from sglang_ext.prefill_only import serve as serve_prefill_only

    engine = request.app[STATE].engine
    if engine.cfg.mode == "decode":
        return error(400, "/prefill_only is served by prefill and null workers, not decode")
    try:
        body = await json_body(request)
    except BadRequestError as e:
        return error(400, str(e))

    async def generate(gen_body: dict) -> tuple[int, object]:
        try:
            req, _ = parse_generate(gen_body, engine.cfg, request.app[STATE].tokenizer)
        except BadRequestError as e:
            return 400, P.error_body(str(e), 400)
        resp = await serve(request, req, stream=False)
        return resp.status, json.loads(resp.body)

    status, reply = await serve_prefill_only(body, generate)
    return web.json_response(reply, status=status)


async def health(request: web.Request) -> web.Response:
    ok = request.app[STATE].engine.alive
    return web.Response(status=200 if ok else 503, text="" if ok else "engine loop is not running")


async def health_generate(request: web.Request) -> web.Response:
    """One real forward (a fake-host prefill on a prefill worker, as SGLang); decode: loop ping."""
    engine = request.app[STATE].engine
    if engine.cfg.mode == "decode":
        try:
            ok = await engine_call(engine, lambda: True)
        except asyncio.TimeoutError:
            ok = False
        return web.Response(status=200 if ok else 503)
    req = Req(
        rid=f"health-{time.monotonic_ns()}",
        input_ids=[0, 1, 2, 3],
        sampling=SamplingParams(max_new_tokens=1, temperature=0.0),
        bootstrap_host=P.FAKE_BOOTSTRAP_HOST,
        bootstrap_room=0,
    )
    resp = await serve(request, req, stream=False)
    return web.Response(status=200 if resp.status == 200 else 503)


async def model_info(request: web.Request) -> web.Response:
    args: ServerArgs = request.app[STATE].args
    cfg = request.app[STATE].engine.model.config
    return web.json_response(
        {
            "model_path": request.app[STATE].model_dir or args.model_path,
            "tokenizer_path": args.tokenizer_path or args.model_path,
            "served_model_name": args.model_name,
            "is_generation": True,
            "preferred_sampling_params": None,
            P.WEIGHT_VERSION: "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": cfg.model_type,
            "architectures": None,
        }
    )


async def _stats(request: web.Request) -> dict:
    engine = request.app[STATE].engine
    return await engine_call(engine, engine.stats)


async def server_info(request: web.Request) -> web.Response:
    args: ServerArgs = request.app[STATE].args
    engine = request.app[STATE].engine
    stats = await _stats(request)
    info = args.to_dict()
    info["model_path"] = request.app[STATE].model_dir or args.model_path
    info.update(
        {
            "version": VERSION,
            "backend": "torch",
            "tp_size": 1,
            "dp_size": 1,
            "max_total_num_tokens": engine.cfg.max_total_tokens,
            "context_length": engine.cfg.context_length,
            "max_req_input_len": engine.cfg.context_length - 1,
            "internal_states": [stats],
            "kv_pool": stats,
        }
    )
    return web.json_response(info)


async def get_load(request: web.Request) -> web.Response:
    s = await _stats(request)
    used = (s["in_use_pages"]) * s["page_size"]
    return web.json_response(
        [
            {
                "dp_rank": 0,
                "num_reqs": s["num_running_reqs"],
                "num_waiting_reqs": s["num_waiting_reqs"],
                "num_tokens": used,
            }
        ]
    )


async def flush_cache(request: web.Request) -> web.Response:
    engine = request.app[STATE].engine
    try:
        ok = await engine_call(engine, engine.flush_cache)
    except asyncio.TimeoutError:
        return error(503, "the engine did not answer in time; retry later")
    if ok:
        return web.Response(text="Cache flushed.\n")
    return error(
        400,
        "cache not flushed: requests are running or queued; retry when idle",
    )


async def abort_request(request: web.Request) -> web.Response:
    try:
        body = await json_body(request)
    except BadRequestError as e:
        return error(400, str(e))
    engine = request.app[STATE].engine
    if body.get("abort_all"):
        try:
            n = await engine_call(engine, engine.abort_all)
        except asyncio.TimeoutError:
            return error(503, "the engine did not answer in time; retry later")
        return web.json_response({"success": True, "aborted": n})
    rid = body.get(P.RID)
    if not isinstance(rid, str) or not rid:
        return error(400, "abort_request needs 'rid' (a string) or 'abort_all': true")
    try:
        found = await asyncio.wait_for(asyncio.wrap_future(engine.abort(rid)), 60)
    except asyncio.TimeoutError:
        return error(503, "the engine did not answer in time; retry later")
    # SGLang answers 200 for an unknown rid too (it may have just finished); say so in the body.
    msg = "aborted" if found else f"no live request with rid '{rid}' (finished or never existed)"
    return web.json_response({"success": found, "message": msg})


@web.middleware
async def json_errors(request: web.Request, handler) -> web.StreamResponse:
    """aiohttp's own errors (404 unknown route, 405, 413 body too large) as SGLang's JSON error
    body, like every error the routes return themselves."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return error(e.status, f"{request.method} {request.path}: {e.text or e.reason}")


def make_app(args: ServerArgs, engine=None, tokenizer=None) -> web.Application:
    """The worker app. The engine is built (model loaded) at startup unless one is given."""
    app = web.Application(middlewares=[json_errors], client_max_size=MAX_BODY_BYTES)
    state = app[STATE] = WorkerState(args)

    async def lifecycle(app: web.Application):
        from sglang_ext.engine.model_store import resolve_model_path

        tok = tokenizer
        if tok is None and not args.skip_tokenizer_init:
            from sglang_ext.hf_tokenizer import load_tokenizer

            tok = load_tokenizer(resolve_model_path(args.tokenizer_path or args.model_path))
        with contextlib.suppress(FileNotFoundError):
            # Report the local directory: the sglang-router loads its tokenizer from model_path.
            state.model_dir = resolve_model_path(args.model_path)
        eng = engine
        if eng is None:
            from sglang_ext.engine.engine import build_engine

            eng = await asyncio.get_running_loop().run_in_executor(None, build_engine, args, tok)
        state.engine, state.tokenizer = eng, tok
        eng.start()
        yield
        eng.shutdown()

    app.cleanup_ctx.append(lifecycle)
    r = app.router
    r.add_post("/generate", generate)
    r.add_post(P.PREFILL_ONLY_PATH, prefill_only)
    for path, fn in (
        ("/health", health),
        ("/health_generate", health_generate),
        ("/get_model_info", model_info),
        ("/model_info", model_info),
        ("/get_server_info", server_info),
        ("/server_info", server_info),
        ("/get_load", get_load),
    ):
        r.add_get(path, fn)
    r.add_route("*", "/flush_cache", flush_cache)
    r.add_post("/abort_request", abort_request)
    openai_api.add_routes(app)
    add_metrics_route(app)
    return app
