"""The shell router's HTTP API (aiohttp): whole-graph runs, per-agent streams for drivers that fire
every agent at once, an OpenAI-compatible chat endpoint whose `model` is a topology name, health
and Prometheus metrics. `make_app` builds it (tests); `main` serves it (`python -m router`)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from router.cluster import ClusterSpec
from router.config import TopologyConfig
from router.config_loader import ConfigError, config_from_dict, load_config
from router.context import ConfigNotServed, RouterContext
from router.early_exit_hook import EarlyExitHooks
from router.orchestrator import MODES, AgentFailed, CompletionHook, Session, UnknownAgent
from router.sessions import SessionConflict, SessionStore
from sglang_ext import protocol as P

log = logging.getLogger(__name__)

CTX = web.AppKey("ctx", RouterContext)
STORE = web.AppKey("sessions", SessionStore)
CONFIGS = web.AppKey("configs", dict)
HOOK = web.AppKey("hook", object)


class BadRequest(ValueError):
    pass


def make_app(
    cluster: ClusterSpec,
    configs: dict[str, TopologyConfig],
    early_exit_hook: Callable[[TopologyConfig], CompletionHook] | None = None,
) -> web.Application:
    """`configs` are served by name; requests may also name a cfgs/ file or pass one inline.
    `early_exit_hook(cfg)` builds the per-question completion hook used when a request asks for
    early exit or its config for aggregator bypass; by default `EarlyExitHooks()`, whose
    embedding model loads on the first question that needs it."""
    app = web.Application(middlewares=[_errors])
    app[CONFIGS] = dict(configs)
    app[HOOK] = early_exit_hook if early_exit_hook is not None else EarlyExitHooks()

    async def context(app: web.Application) -> AsyncIterator[None]:
        async with RouterContext.open(cluster) as ctx:
            # Load tokenizers now, off the loop, not inside the first question.
            for model in cluster.models:
                await asyncio.to_thread(ctx.tokenizer, model)
            app[CTX] = ctx
            app[STORE] = SessionStore(ctx)
            yield
            await app[STORE].close()
            if isinstance(app[HOOK], EarlyExitHooks):
                app[HOOK].close()

    app.cleanup_ctx.append(context)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/moa/run", run_graph)
    app.router.add_post("/v1/moa/agent", run_agent)
    app.router.add_post("/v1/chat/completions", chat_completions)
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
    except web.HTTPException:
        raise
    except Exception as e:  # a bug still answers JSON, and is logged
        log.exception("%s failed", request.path)
        resp = _error(500, f"internal error: {type(e).__name__}: {e}")
    ctx.metrics.requests.labels(request.path, str(resp.status)).inc()
    return resp


def _error(status: int, message: str) -> web.Response:
    return web.json_response(P.error_body(message, status), status=status)


async def _body(request: web.Request) -> dict:
    try:
        body = await request.json()
    except json.JSONDecodeError as e:
        raise BadRequest(f"the body is not JSON: {e}") from e
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _config(request: web.Request, ref) -> TopologyConfig:
    if isinstance(ref, dict):
        return config_from_dict(ref, "<inline config>")
    if not isinstance(ref, str) or not ref:
        raise BadRequest("'config' must be a config name, a cfgs/ path or an inline JSON object")
    configs = request.app[CONFIGS]
    if ref not in configs:
        configs[ref] = load_config(ref)
    return configs[ref]


def _mode(body: dict) -> str:
    mode = body.get("mode", "pipelined")
    if mode not in MODES:
        raise BadRequest(f"'mode' must be one of {', '.join(MODES)}, not {mode!r}")
    return mode


def _question(body: dict) -> str:
    q = body.get("question")
    if not isinstance(q, str) or not q.strip():
        raise BadRequest("'question' must be a non-empty string")
    return q


def _question_id(body: dict) -> str | None:
    qid = body.get("question_id")
    if qid is not None and not isinstance(qid, (str, int)):
        raise BadRequest("'question_id' must be a string (it keys the early-exit draws)")
    return None if qid is None else str(qid)


def _new_session(request: web.Request, body: dict, cfg: TopologyConfig) -> Session:
    hook = None
    early_exit = bool(body.get("early_exit", cfg.early_exit.enabled))
    if early_exit or cfg.aggregator_bypass.enabled:
        factory = request.app[HOOK]
        if factory is None:
            raise BadRequest("early exit was asked for but this router has no early-exit hook")
        # The request's flag wins over the config's: the hook reads early_exit.enabled.
        ee = cfg.early_exit.model_copy(update={"enabled": early_exit})
        try:
            hook = factory(cfg.model_copy(update={"early_exit": ee}))
        except ValueError as e:
            raise BadRequest(f"early exit cannot run for config '{cfg.name}': {e}") from e
    return Session(
        request.app[CTX],
        cfg,
        _question(body),
        _mode(body),
        body.get("session_id"),
        slot_orders=body.get("slot_orders"),
        on_completion=hook,
        question_id=_question_id(body),
    )


async def health(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    return web.json_response(
        {"status": "ok", "models": sorted(ctx.cluster.models), "sessions": len(request.app[STORE])}
    )


async def metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=request.app[CTX].metrics.render(),
        headers={"Content-Type": "text/plain; version=0.0.4"},
    )


async def run_graph(request: web.Request) -> web.Response:
    """{question, config, mode?, early_exit?, question_id?, slot_orders?} → {answer, final_agent,
    trace, early_exit}; `question_id` keys the early-exit draws (else the question text)."""
    body = await _body(request)
    cfg = _config(request, body.get("config"))
    session = _new_session(request, body, cfg)
    try:
        result = await session.run_all()
    except AgentFailed as e:
        return web.json_response(
            {
                **P.error_body(str(e), 502),
                "trace": session.trace(),
                "early_exit": session.early_exit,
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
        }
    )


async def _follow(
    session: Session, agent_id: str
) -> AsyncIterator[tuple[list[int], list[float], str]]:
    """(new ids, new logprobs, cumulative text) of one agent as its APC entry grows."""
    answer, sent = session.apc[agent_id], 0
    while True:
        seen = session.apc.version
        if len(answer.output_ids) > sent:
            n = len(answer.output_ids)
            yield answer.output_ids[sent:n], answer.logprobs[sent:n], answer.text
            sent = n
            continue
        if answer.ended:
            return
        await session.apc.wait_change(seen)


async def run_agent(request: web.Request) -> web.StreamResponse:
    """{session_id, config, question, mode?, agent, stream?}: run one agent of a question; SSE
    events {agent, output_ids (new), logprobs (new), text}, then one with its trace."""
    body = await _body(request)
    cfg = _config(request, body.get("config"))
    sid, agent_id = body.get("session_id"), body.get("agent")
    if not isinstance(sid, str) or not isinstance(agent_id, str):
        raise BadRequest("'session_id' and 'agent' must be strings")
    store = request.app[STORE]
    session = store.enter(sid, cfg, _question(body), _mode(body))
    try:
        task = session.start_agent(agent_id)
        if not body.get("stream", True):
            await asyncio.wait([task])
            return _agent_reply(session, agent_id)
        resp = web.StreamResponse(headers={"Content-Type": P.SSE_CONTENT_TYPE})
        await resp.prepare(request)
        async for ids, lps, text in _follow(session, agent_id):
            await resp.write(
                P.sse_event({"agent": agent_id, P.OUTPUT_IDS: ids, "logprobs": lps, P.TEXT: text})
            )
        await asyncio.wait([task])
        final = session.traces[agent_id].to_dict()
        if final["error"]:
            await resp.write(P.sse_event({"error": {"message": final["error"]}}))
        await resp.write(P.sse_event({"agent": agent_id, "done": True, "trace": final}))
        await resp.write(P.sse_done())
        return resp
    except (asyncio.CancelledError, ConnectionResetError):
        # The client went away: nobody reads this agent any more.
        session.tasks[agent_id].cancel() if agent_id in session.tasks else None
        raise
    finally:
        store.leave(session)


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


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """OpenAI chat completions where `model` names a topology; the last user message is the
    question; streams the final agent's answer."""
    body = await _body(request)
    name = body.get("model")
    messages = body.get("messages") or []
    users = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    if not users or not isinstance(users[-1], str):
        raise BadRequest("'messages' must hold at least one user message with string content")
    cfg = _config(request, name)
    session = _new_session(
        request, {"question": users[-1], "mode": body.get("moa_mode", "pipelined")}, cfg
    )
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    final = cfg.final
    runner = asyncio.create_task(session.run_all())
    try:
        if not body.get("stream"):
            try:
                result = await runner
            except AgentFailed as e:
                return _error(502, str(e))
            n_out = len(result.trace[final]["output_ids"])
            return web.json_response(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": created,
                    "model": name,
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": result.answer},
                        }
                    ],
                    "usage": {
                        "prompt_tokens": result.trace[final]["prompt_tokens"] or 0,
                        "completion_tokens": n_out,
                        "total_tokens": (result.trace[final]["prompt_tokens"] or 0) + n_out,
                    },
                }
            )
        resp = web.StreamResponse(headers={"Content-Type": P.SSE_CONTENT_TYPE})
        await resp.prepare(request)
        shown = ""

        def chunk(delta: dict, finish: str | None = None) -> bytes:
            return P.sse_event(
                {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": name,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
            )

        await resp.write(chunk({"role": "assistant"}))
        async for _ids, _lps, text in _follow(session, final):
            if text.startswith(shown) and len(text) > len(shown):
                await resp.write(chunk({"content": text[len(shown) :]}))
                shown = text
        try:
            await runner
            await resp.write(chunk({}, "stop"))
        except AgentFailed as e:
            await resp.write(P.sse_event({"error": {"message": str(e)}}))
        await resp.write(P.sse_done())
        return resp
    finally:
        if not runner.done():
            runner.cancel()
            await asyncio.wait([runner])
        session.release()
