"""The shell router's HTTP API (aiohttp): whole-graph runs, per-agent streams for drivers that fire
every agent at once, an OpenAI-compatible chat endpoint whose `model` is a topology name
(chat_api.py), health and Prometheus metrics. `make_app` builds it (tests); `main` serves it
(`python -m router`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from router.api_request import (
    CONFIGS,
    CTX,
    HOOK,
    STORE,
    BadRequest,
    config_of,
    new_session,
    read_request,
)
from router.api_schema import MoaAgentRequest, MoaRunRequest
from router.chat_api import chat_completions, completions, list_models
from router.cluster import ClusterSpec
from router.config import TopologyConfig
from router.config_loader import ConfigError
from router.context import ConfigNotServed, RouterContext
from router.early_exit_hook import EarlyExitHooks
from router.health_watch import WorkerDown
from router.orchestrator import AgentFailed, CompletionHook, Session, UnknownAgent
from router.sessions import SessionConflict, SessionStore
from sglang_ext import protocol as P

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 4 * 1024**2  # a longer body is a 413


def make_app(
    cluster: ClusterSpec,
    configs: dict[str, TopologyConfig],
    early_exit_hook: Callable[[TopologyConfig], CompletionHook] | None = None,
    client_max_size: int = MAX_BODY_BYTES,
) -> web.Application:
    """`configs` are served by name; requests may also name a cfgs/ file or pass one inline.
    `early_exit_hook(cfg)` builds the per-question completion hook used when a request asks for
    early exit or its config for aggregator bypass; by default `EarlyExitHooks()`, whose
    embedding model loads on the first question that needs it. A body over `client_max_size`
    bytes is a 413."""
    app = web.Application(middlewares=[_errors], client_max_size=client_max_size)
    app[CONFIGS] = dict(configs)
    app[HOOK] = early_exit_hook if early_exit_hook is not None else EarlyExitHooks()

    async def context(app: web.Application) -> AsyncIterator[None]:
        async with RouterContext.open(cluster) as ctx:
            # Load tokenizers now, off the loop, not inside the first question.
            for model in cluster.models:
                await asyncio.to_thread(ctx.tokenizer, model)
            app[CTX] = ctx
            app[STORE] = SessionStore(ctx)
            watch = asyncio.create_task(ctx.health.run(), name="health-watch")
            yield
            watch.cancel()
            await asyncio.wait([watch])
            await app[STORE].close()
            if isinstance(app[HOOK], EarlyExitHooks):
                app[HOOK].close()

    app.cleanup_ctx.append(context)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/moa/run", run_graph)
    app.router.add_post("/v1/moa/agent", run_agent)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", list_models)
    return app


@web.middleware
async def _errors(request: web.Request, handler) -> web.StreamResponse:
    ctx = request.app[CTX]
    try:
        resp = await handler(request)
    except (BadRequest, ConfigError, ConfigNotServed, SessionConflict, UnknownAgent) as e:
        resp = _error(400, str(e))
    except AgentFailed as e:
        resp = _error(502, str(e))
    except WorkerDown as e:
        resp = _error(503, str(e))
    except web.HTTPException as e:
        if e.status < 400:
            raise
        # aiohttp's own errors (404 unknown route, 405, 413 body too large) as JSON too.
        resp = _error(e.status, _http_message(request, e))
    except Exception as e:  # a bug still answers JSON, and is logged
        log.exception("%s failed", request.path)
        resp = _error(500, f"internal error: {type(e).__name__}: {e}")
    ctx.metrics.requests.labels(request.path, str(resp.status)).inc()
    return resp


def _http_message(request: web.Request, e: web.HTTPException) -> str:
    if e.status == 404:
        return (
            f"no route {request.method} {request.path}; routes: POST /v1/chat/completions, "
            "POST /v1/completions, GET /v1/models, POST /v1/moa/run, POST /v1/moa/agent, "
            "GET /health, GET /metrics"
        )
    if e.status == 413:
        return f"the body is too large: {e.text}"
    return f"{request.method} {request.path}: {e.reason}"


def _error(status: int, message: str) -> web.Response:
    return web.json_response(P.error_body(message, status), status=status)


async def health(request: web.Request) -> web.Response:
    """200 while every process of the deployment answers; 503 "degraded" naming the ones that
    are down (and their log files) once one is not."""
    ctx = request.app[CTX]
    down = ctx.health.status()
    return web.json_response(
        {
            "status": "degraded" if down else "ok",
            "models": sorted(ctx.cluster.models),
            "sessions": len(request.app[STORE]),
            "down": down,
        },
        status=503 if down else 200,
    )


async def metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=request.app[CTX].metrics.render(),
        headers={"Content-Type": "text/plain; version=0.0.4"},
    )


async def run_graph(request: web.Request) -> web.Response:
    """{question, config, mode?, early_exit?, question_id?, dataset?, task?, slot_orders?} →
    {answer, final_agent, trace, early_exit, started_at}; `question_id` keys the early-exit
    draws (else the question text); `dataset` picks the answer extractor majority vote uses."""
    body = await read_request(request, MoaRunRequest)
    cfg = config_of(request, body.config)
    session = new_session(
        request,
        cfg,
        body.question,
        body.mode,
        body.early_exit,
        body.session_id,
        body.slot_orders,
        body.question_id,
        body.dataset,
        body.task,
    )
    try:
        result = await session.run_all()
    except AgentFailed as e:
        return web.json_response(
            {
                **P.error_body(str(e), 502),
                "trace": session.trace(),
                "early_exit": session.early_exit,
                "started_at": session.clock.wall_t0,
            },
            status=502,
        )
    finally:
        session.release()
    return web.json_response(
        {
            "session_id": result.session_id,
            "answer": result.answer,
            "final_agent": result.final_agent,
            "mode": session.mode,
            "config": cfg.name,
            "trace": result.trace,
            "early_exit": result.early_exit,
            # Wall time (epoch s) of the session clock's zero: the trace's times count from it.
            "started_at": session.clock.wall_t0,
        }
    )


async def run_agent(request: web.Request) -> web.StreamResponse:
    """{session_id, config, question, mode?, agent, stream?}: run one agent of a question; SSE
    events {agent, output_ids (new), logprobs (new), text}, then one with its trace."""
    body = await read_request(request, MoaAgentRequest)
    cfg = config_of(request, body.config)
    sid, agent_id = body.session_id, body.agent
    store = request.app[STORE]
    session = store.enter(sid, cfg, body.question, body.mode)
    session.followers[agent_id] += 1
    try:
        try:
            task = session.start_agent(agent_id)
            if not body.stream:
                await asyncio.wait([task])
                return _agent_reply(session, agent_id)
            return await _agent_stream(request, session, agent_id, task)
        finally:
            session.followers[agent_id] -= 1
    except (asyncio.CancelledError, ConnectionResetError):
        # This client went away. The agent runs on while another client follows it or a
        # successor of the session (running, or still to be requested) reads it; the session's
        # linger timeout ends it if those never come.
        task = session.tasks.get(agent_id)
        if task is not None and not session.still_needed(agent_id):
            task.cancel()
        raise
    finally:
        store.leave(session)


async def _agent_stream(
    request: web.Request, session: Session, agent_id: str, task: asyncio.Task
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": P.SSE_CONTENT_TYPE})
    await resp.prepare(request)
    async for ids, lps, text in session.apc.follow(agent_id):
        await resp.write(
            P.sse_event({"agent": agent_id, P.OUTPUT_IDS: ids, "logprobs": lps, P.TEXT: text})
        )
    await asyncio.wait([task])
    final = session.traces[agent_id].to_dict()
    if final["error"]:
        await resp.write(P.sse_error(final["error"], 502))
    await resp.write(P.sse_event({"agent": agent_id, "done": True, "trace": final}))
    await resp.write(P.sse_done())
    return resp


def _agent_reply(session: Session, agent_id: str) -> web.Response:
    trace = session.traces[agent_id].to_dict()
    status = 502 if trace["error"] else 200
    return web.json_response(
        {
            "agent": agent_id,
            P.TEXT: trace["text"],
            P.OUTPUT_IDS: trace["output_ids"],
            "trace": trace,
            **(P.error_body(trace["error"], 502) if trace["error"] else {}),
        },
        status=status,
    )
