"""The shell router's HTTP API (aiohttp): whole-graph runs, per-agent streams for drivers that fire
every agent at once, an OpenAI-compatible chat endpoint whose `model` is a topology name
(chat_api.py), the registration of topologies, health, Prometheus metrics and the router's own load
(`/v1/moa/stats`: CPU seconds, event-loop lag; loop_lag.py); behind an optional
API key (api_key.py). `make_app` builds it (tests); `main` serves it (`python -m router`)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from router.api_errors import error_body, error_response, internal_addresses, scrub, sse_error
from router.api_key import has_key, require_key
from router.api_request import (
    ADDRESSES,
    CONFIGS,
    CTX,
    HOOK,
    ROUTERS,
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
from router.config_loader import ConfigError, config_from_dict
from router.context import ConfigNotServed, RouterContext
from router.early_exit_hook import EarlyExitHooks
from router.health_watch import WorkerDown
from router.loop_lag import running_probe
from router.orchestrator import AgentFailed, CompletionHook, Session, UnknownAgent
from router.prompt_limits import PromptTooLong, check_prompts_fit
from router.served_configs import (
    ConfigConflict,
    ModelNotFound,
    RegistrationRefused,
    ServedConfigs,
)
from router.sessions import SessionConflict, SessionStore
from routing.router_hook import PoolRouters
from routing.routing_files import RoutingFiles
from sglang_ext import protocol as P

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 4 * 1024**2  # a longer body is a 413
API_KEY = web.AppKey("api_key", object)  # str | None


def make_app(
    cluster: ClusterSpec,
    configs: dict[str, TopologyConfig],
    early_exit_hook: Callable[[TopologyConfig], CompletionHook] | None = None,
    client_max_size: int = MAX_BODY_BYTES,
    api_key: str | None = None,
) -> web.Application:
    """`configs` are served by name, with those registered later (POST /v1/moa/configs); a
    request naming anything else is a 404. `early_exit_hook(cfg)` builds the per-question
    completion hook used when a request asks for early exit or its config for aggregator
    bypass; by default `EarlyExitHooks()`, whose embedding model loads on the first question
    that needs it. A body over `client_max_size` bytes is a 413. With `api_key`, every route
    but /health needs it as a bearer token."""
    middlewares = [_errors] + ([require_key(api_key)] if api_key else [])
    app = web.Application(middlewares=middlewares, client_max_size=client_max_size)
    # The scorers and profiles of the start-up configs, read now; a registered config names
    # one of them or sends its own inline, never a path to read (routing/routing_files.py).
    deployed = {name: m.model_path for name, m in cluster.models.items()}
    files = RoutingFiles.at_start(configs.values(), deployed)
    app[CONFIGS] = ServedConfigs(configs, files)
    app[API_KEY] = api_key or None
    app[HOOK] = early_exit_hook if early_exit_hook is not None else EarlyExitHooks()
    # Routing shares the early-exit hooks' embedding services (one MiniLM for both).
    embeddings = app[HOOK] if isinstance(app[HOOK], EarlyExitHooks) else EarlyExitHooks()
    app[ROUTERS] = PoolRouters(embeddings.embedding, files)
    urls = [u for m in cluster.models.values() for u in (m.router_url, *m.prefill_urls)]
    urls += [u for m in cluster.models.values() for u in m.decode_urls]
    app[ADDRESSES] = internal_addresses(urls)

    async def context(app: web.Application) -> AsyncIterator[None]:
        async with RouterContext.open(cluster) as ctx:
            # Load tokenizers now, off the loop, not inside the first question.
            for model in cluster.models:
                await asyncio.to_thread(ctx.tokenizer, model)
            await ctx.load_context_lens()
            app[CTX] = ctx
            app[STORE] = SessionStore(ctx)
            watch = asyncio.create_task(ctx.health.run(), name="health-watch")
            async with running_probe(ctx.metrics.loop_lag):
                yield
            watch.cancel()
            await asyncio.wait([watch])
            await app[STORE].close()
            if isinstance(app[HOOK], EarlyExitHooks):
                app[HOOK].close()

    app.cleanup_ctx.append(context)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/moa/stats", router_stats)
    app.router.add_post("/v1/moa/run", run_graph)
    app.router.add_post("/v1/moa/agent", run_agent)
    app.router.add_post("/v1/moa/configs", register_config)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", list_models)
    return app


_CLIENT_ERRORS = (
    BadRequest,
    ConfigError,
    ConfigNotServed,
    PromptTooLong,
    RegistrationRefused,
    SessionConflict,
    UnknownAgent,
)


@web.middleware
async def _errors(request: web.Request, handler) -> web.StreamResponse:
    ctx = request.app[CTX]
    hidden = request.app[ADDRESSES]
    try:
        resp = await handler(request)
    except _CLIENT_ERRORS as e:
        resp = error_response(400, str(e), hidden)
    except ModelNotFound as e:
        resp = error_response(404, str(e), hidden, param=e.param, code="model_not_found")
    except ConfigConflict as e:
        resp = error_response(409, str(e), hidden, param="name", code="config_conflict")
    except AgentFailed as e:
        resp = error_response(e.status, str(e), hidden)
    except WorkerDown as e:
        resp = error_response(503, str(e), hidden)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        # aiohttp's own errors (404 unknown route, 405, 413 body too large) as JSON too.
        resp = error_response(e.status, _http_message(request, e), hidden)
    except Exception as e:  # a bug still answers JSON, and is logged
        log.exception("%s failed", request.path)
        resp = error_response(500, f"internal error: {type(e).__name__}: {e}", hidden)
    ctx.metrics.requests.labels(request.path, str(resp.status)).inc()
    return resp


def _http_message(request: web.Request, e: web.HTTPException) -> str:
    if e.status == 404:
        return (
            f"no route {request.method} {request.path}; routes: POST /v1/chat/completions, "
            "POST /v1/completions, GET /v1/models, POST /v1/moa/run, POST /v1/moa/agent, "
            "POST /v1/moa/configs, GET /v1/moa/stats, GET /health, GET /metrics"
        )
    if e.status == 413:
        return f"the body is too large: {e.text}"
    return f"{request.method} {request.path}: {e.reason}"


async def health(request: web.Request) -> web.Response:
    """200 while every process of the deployment answers; 503 "degraded" naming the ones that
    are down (and their log files) once one is not. Open to all (probes); behind an API key, a
    caller without it gets the status alone, not what runs where."""
    ctx = request.app[CTX]
    down = ctx.health.status()
    body = {"status": "degraded" if down else "ok"}
    if has_key(request, request.app[API_KEY]):
        body |= {
            "models": sorted(ctx.cluster.models),
            "sessions": len(request.app[STORE]),
            "down": down,
        }
    return web.json_response(body, status=503 if down else 200)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=request.app[CTX].metrics.render(),
        headers={"Content-Type": "text/plain; version=0.0.4"},
    )


async def router_stats(request: web.Request) -> web.Response:
    """The router's own load so far: {boot_id, time_s, cpu_s, event_loop_lag: {period_s, le,
    counts (cumulative per bound), count, sum}} (RouterMetrics.stats). The runner diffs two
    of them around each question (experiments/run.py)."""
    return web.json_response(request.app[CTX].metrics.stats())


async def run_graph(request: web.Request) -> web.Response:
    """{question, config, mode?, early_exit?, question_id?, dataset?, task?, slot_orders?} →
    {answer, final_agent, trace, early_exit, started_at}; `question_id` keys the early-exit
    draws (else the question text); `dataset` picks the answer extractor majority vote uses."""
    body = await read_request(request, MoaRunRequest)
    cfg = config_of(request, body.config, "config")
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
                **error_body(e.status, scrub(str(e), request.app[ADDRESSES])),
                "trace": session.trace(),
                "early_exit": session.early_exit,
                "routing": session.routing,
                "posterior": session.posterior,
                "started_at": session.clock.wall_t0,
            },
            status=e.status,
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
            "routing": result.routing,
            "posterior": result.posterior,
            # Wall time (epoch s) of the session clock's zero: the trace's times count from it.
            "started_at": session.clock.wall_t0,
        }
    )


async def run_agent(request: web.Request) -> web.StreamResponse:
    """{session_id, config, question, mode?, agent, stream?}: run one agent of a question; SSE
    events {agent, output_ids (new), logprobs (new), text}, then one with its trace."""
    body = await read_request(request, MoaAgentRequest)
    cfg = config_of(request, body.config, "config")
    sid, agent_id = body.session_id, body.agent
    if agent_id in {a.id for a in cfg.agents}:
        request.app[CTX].check_served(cfg)
        check_prompts_fit(request.app[CTX], cfg, body.question, [agent_id])
    store = request.app[STORE]
    session = store.enter(sid, cfg, body.question, body.mode)
    session.followers[agent_id] += 1
    try:
        try:
            task = session.start_agent(agent_id)
            if not body.stream:
                await asyncio.wait([task])
                return _agent_reply(request, session, agent_id)
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
        await resp.write(sse_error(final["error"], session.error_status, request.app[ADDRESSES]))
    await resp.write(P.sse_event({"agent": agent_id, "done": True, "trace": final}))
    await resp.write(P.sse_done())
    return resp


async def register_config(request: web.Request) -> web.Response:
    """A topology config (a JSON object, as in cfgs/) to serve by its name: 201 when new, 200
    when that name already serves the same config, 409 when it serves another. Its models must
    be ones this router serves; its routing.scorer and routing.profile, ones this router loaded
    at start (by path or digest) or sent inline as JSON objects: no path it names is read
    (routing/routing_files.py). The runner registers the configs it runs this way."""
    try:
        raw = json.loads(await request.read())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadRequest(f"the body is not JSON: {e}; send a topology config object") from None
    served = request.app[CONFIGS]
    admitted = served.files.admit(raw)  # before anything else looks at a path in it
    cfg = config_from_dict(admitted.raw, "request body")
    request.app[CTX].check_served(cfg)
    served.files.check_model_paths(cfg)
    served.files.check_registered(cfg, admitted)
    created = served.register(cfg, admitted)
    if created:
        log.info("registered topology '%s'", cfg.name)
    body = {"id": cfg.name, "object": "model", "owned_by": "moa-pd", "created": created}
    if cfg.routing is not None:  # the digests to name its scorer and profile by from now on
        body["routing_files"] = served.files.digests(cfg)
    return web.json_response(body, status=201 if created else 200)


def _agent_reply(request: web.Request, session: Session, agent_id: str) -> web.Response:
    trace = session.traces[agent_id].to_dict()
    status = session.error_status if trace["error"] else 200
    hidden = request.app[ADDRESSES]
    return web.json_response(
        {
            "agent": agent_id,
            P.TEXT: trace["text"],
            P.OUTPUT_IDS: trace["output_ids"],
            "trace": trace,
            **(error_body(status, scrub(trace["error"], hidden)) if status != 200 else {}),
        },
        status=status,
    )
