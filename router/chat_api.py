"""The OpenAI-compatible surface, where `model` names a topology: `/v1/chat/completions` (the
last user message is the question), `/v1/completions` (the prompt is the question) and
`/v1/models` (each served topology as a model). The final agent's answer is the reply, streamed
as OpenAI chunks when asked; `usage` counts the final agent's tokens and `moa_usage` every
agent's, per agent and per model. Mounted by server.py, so any OpenAI client or evaluation
harness can use an MoA as a model."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

from aiohttp import web

from router.api_errors import error_response, sse_error
from router.api_request import (
    ADDRESSES,
    CONFIGS,
    config_of,
    new_session,
    read_request,
    with_final_sampling,
)
from router.api_schema import ChatRequest, CompletionRequest
from router.orchestrator import AgentFailed, QuestionResult, Session
from sglang_ext import protocol as P

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Reply:
    """What every object of one completion carries; `chat` picks chat or text completion."""

    id: str
    created: int
    model: str
    chat: bool

    def obj(self, choice: dict, chunk: bool = False) -> dict:
        kind = "chat.completion" if self.chat else "text_completion"
        return {
            "id": self.id,
            "object": kind + (".chunk" if chunk and self.chat else ""),
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, **choice}],
        }

    def piece(self, text: str | None, finish: str | None = None, role: bool = False) -> dict:
        """One streamed chunk's choice: a chat delta, or a text completion's text."""
        if not self.chat:
            return {"text": text or "", "finish_reason": finish, "logprobs": None}
        delta = {"role": "assistant"} if role else ({"content": text} if text else {})
        return {"delta": delta, "finish_reason": finish}


async def chat_completions(request: web.Request) -> web.StreamResponse:
    body = await read_request(request, ChatRequest)
    return await _complete(request, body, chat=True)


async def completions(request: web.Request) -> web.StreamResponse:
    body = await read_request(request, CompletionRequest)
    return await _complete(request, body, chat=False)


async def list_models(request: web.Request) -> web.Response:
    """Every topology this router serves by name (configs it was started with, and those
    registered since)."""
    now = int(time.time())
    data = [
        {"id": name, "object": "model", "created": now, "owned_by": "moa-pd"}
        for name in request.app[CONFIGS].names()
    ]
    return web.json_response({"object": "list", "data": data})


async def _complete(
    request: web.Request, body: ChatRequest | CompletionRequest, chat: bool
) -> web.StreamResponse:
    question = body.question
    cfg = with_final_sampling(config_of(request, body.model, "model"), body.final_sampling())
    session = new_session(request, cfg, question, body.moa_mode, body.early_exit)
    model = cfg.name
    prefix = "chatcmpl" if chat else "cmpl"
    reply = _Reply(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), model, chat)
    runner = asyncio.create_task(session.run_all())
    try:
        if body.stream:
            return await _streamed(request, session, runner, reply, body.include_usage)
        return await _whole(runner, reply, request.app[ADDRESSES])
    finally:
        if not runner.done():
            runner.cancel()
            await asyncio.wait([runner])
        session.release()


def _finish_reason(result: QuestionResult) -> str:
    """OpenAI's finish_reason from the final agent's own (SGLang's {"type": ...})."""
    reason = result.trace[result.final_agent].get("finish_reason") or {}
    return "length" if reason.get("type") == P.FINISH_LENGTH else "stop"


def _answer(result: QuestionResult) -> str:
    """The final answer without the stop string that ended it (OpenAI never returns it)."""
    reason = result.trace[result.final_agent].get("finish_reason") or {}
    matched = reason.get("matched")
    if reason.get("type") == P.FINISH_STOP and isinstance(matched, str) and matched:
        cut = result.answer.find(matched)
        if cut >= 0:
            return result.answer[:cut]
    return result.answer


def usage(result: QuestionResult) -> tuple[dict, dict]:
    """(OpenAI usage of the final agent, moa_usage: per agent, per model and in total)."""
    agents, models = {}, {}
    for agent_id, t in result.trace.items():
        row = {
            "model": t["model"],
            "prompt_tokens": t.get("prompt_tokens") or 0,
            "completion_tokens": len(t.get("output_ids") or []),
            "cached_tokens": t.get("cached_tokens") or 0,
        }
        agents[agent_id] = row
        m = models.setdefault(
            t["model"],
            {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0, "agents": 0},
        )
        for k in ("prompt_tokens", "completion_tokens", "cached_tokens"):
            m[k] += row[k]
        m["agents"] += 1
    total = {
        k: sum(m[k] for m in models.values())
        for k in ("prompt_tokens", "completion_tokens", "cached_tokens")
    }
    final = agents.get(result.final_agent) or {"prompt_tokens": 0, "completion_tokens": 0}
    n_prompt, n_out = final["prompt_tokens"], final["completion_tokens"]
    return (
        {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out},
        {"agents": agents, "models": models, "total": total},
    )


async def _whole(runner: asyncio.Task, reply: _Reply, hidden: list[str]) -> web.Response:
    try:
        result = await runner
    except AgentFailed as e:
        return error_response(e.status, str(e), hidden)
    text = _answer(result)
    if reply.chat:
        choice = {
            "finish_reason": _finish_reason(result),
            "message": {"role": "assistant", "content": text},
        }
    else:
        choice = {"text": text, "finish_reason": _finish_reason(result), "logprobs": None}
    openai_usage, moa_usage = usage(result)
    return web.json_response({**reply.obj(choice), "usage": openai_usage, "moa_usage": moa_usage})


async def _streamed(
    request: web.Request, session: Session, runner: asyncio.Task, reply: _Reply, include_usage: bool
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": P.SSE_CONTENT_TYPE})
    await resp.prepare(request)

    def chunk(choice: dict) -> bytes:
        return P.sse_event(reply.obj(choice, chunk=True))

    if reply.chat:
        await resp.write(chunk(reply.piece(None, role=True)))
    stops = session.cfg.sampling_of(session.cfg.final).stop or []
    # Text that could be the start of a stop string is held back until it cannot be.
    hold = max((len(s) for s in stops), default=1) - 1
    shown = ""
    async for _ids, _lps, text in session.apc.follow(session.cfg.final):
        # A trailing U+FFFD is half a UTF-8 character: its rest comes with the next token.
        visible = text.rstrip("\ufffd")
        visible = visible[: len(visible) - hold] if hold else visible
        if any(s in visible for s in stops):
            continue  # the stop string arrived: the final answer (trimmed) comes at the end
        if visible.startswith(shown) and len(visible) > len(shown):
            await resp.write(chunk(reply.piece(visible[len(shown) :])))
            shown = visible
    try:
        result = await runner
    except AgentFailed as e:
        await resp.write(sse_error(str(e), e.status, request.app[ADDRESSES]))
    else:
        answer = _answer(result)
        if answer.startswith(shown):
            if rest := answer[len(shown) :]:
                await resp.write(chunk(reply.piece(rest)))
        else:  # the final answer was replaced (aggregator bypass) after part of it was sent
            log.warning("completion %s: the final answer changed after streaming began", reply.id)
        await resp.write(chunk(reply.piece(None, _finish_reason(result))))
        if include_usage:
            openai_usage, moa_usage = usage(result)
            await resp.write(
                P.sse_event(
                    {
                        **reply.obj({}, chunk=True),
                        "choices": [],
                        "usage": openai_usage,
                        "moa_usage": moa_usage,
                    }
                )
            )
    await resp.write(P.sse_done())
    return resp
