"""`/v1/chat/completions` where `model` names a topology: the last user message is the question,
the final agent's answer is the reply (streamed as OpenAI chunks when asked). Mounted by server.py,
so any OpenAI client or evaluation harness can use an MoA as a model."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

from aiohttp import web

from router.api_request import BadRequest, config_of, new_session, read_body
from router.orchestrator import AgentFailed, QuestionResult, Session
from sglang_ext import protocol as P

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Reply:
    """What every object of one completion carries."""

    id: str
    created: int
    model: str

    def obj(self, kind: str, choice: dict) -> dict:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, **choice}],
        }


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """OpenAI chat completions where `model` names a topology; `moa_mode` picks the mode."""
    body = await read_body(request)
    messages = body.get("messages") or []
    users = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    if not users or not isinstance(users[-1], str):
        raise BadRequest("'messages' must hold at least one user message with string content")
    cfg = config_of(request, body.get("model"))
    session = new_session(
        request, {"question": users[-1], "mode": body.get("moa_mode", "pipelined")}, cfg
    )
    reply = _Reply(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), body["model"])
    runner = asyncio.create_task(session.run_all())
    try:
        if body.get("stream"):
            return await _streamed(request, session, runner, reply)
        return await _whole(runner, reply)
    finally:
        if not runner.done():
            runner.cancel()
            await asyncio.wait([runner])
        session.release()


def _finish_reason(result: QuestionResult) -> str:
    """OpenAI's finish_reason from the final agent's own (SGLang's {"type": ...})."""
    reason = result.trace[result.final_agent].get("finish_reason") or {}
    return "length" if reason.get("type") == P.FINISH_LENGTH else "stop"


async def _whole(runner: asyncio.Task, reply: _Reply) -> web.Response:
    try:
        result = await runner
    except AgentFailed as e:
        return web.json_response(P.error_body(str(e), 502), status=502)
    final = result.trace[result.final_agent]
    n_prompt, n_out = final["prompt_tokens"] or 0, len(final["output_ids"])
    message = {"role": "assistant", "content": result.answer}
    return web.json_response(
        {
            **reply.obj(
                "chat.completion", {"finish_reason": _finish_reason(result), "message": message}
            ),
            "usage": {
                "prompt_tokens": n_prompt,
                "completion_tokens": n_out,
                "total_tokens": n_prompt + n_out,
            },
        }
    )


async def _streamed(
    request: web.Request, session: Session, runner: asyncio.Task, reply: _Reply
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": P.SSE_CONTENT_TYPE})
    await resp.prepare(request)

    def chunk(delta: dict, finish: str | None = None) -> bytes:
        choice = {"delta": delta, "finish_reason": finish}
        return P.sse_event(reply.obj("chat.completion.chunk", choice))

    await resp.write(chunk({"role": "assistant"}))
    shown = ""
    async for _ids, _lps, text in session.apc.follow(session.cfg.final):
        # A trailing U+FFFD is half a UTF-8 character: its rest comes with the next token.
        visible = text.rstrip("\ufffd")
        if visible.startswith(shown) and len(visible) > len(shown):
            await resp.write(chunk({"content": visible[len(shown) :]}))
            shown = visible
    try:
        result = await runner
    except AgentFailed as e:
        await resp.write(P.sse_event({"error": {"message": str(e)}}))
    else:
        if result.answer.startswith(shown):
            if rest := result.answer[len(shown) :]:
                await resp.write(chunk({"content": rest}))
        else:  # the final answer was replaced (aggregator bypass) after part of it was sent
            log.warning("chat %s: the final answer changed after streaming began", reply.id)
        await resp.write(chunk({}, _finish_reason(result)))
    await resp.write(P.sse_done())
    return resp
