"""OpenAI-compatible routes (`/v1/completions`, `/v1/chat/completions`, `/v1/models`), enough for
the `openai` client: each request becomes a /generate Req and its chunks become OpenAI objects.
Mounted by `server.py`; bootstrap fields in the body pass through, as in SGLang.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from aiohttp import web

from sglang_ext import protocol as P
from sglang_ext.engine.generate_io import ReplyBuilder, parse_generate
from sglang_ext.engine.http_utils import STATE, error, iter_outputs, json_body
from sglang_ext.engine.request import BadRequestError, Req

SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "skip_special_tokens",
    "no_stop_trim",
)


def _generate_body(body: dict, input_ids: list[int] | None, text: str | None) -> dict:
    sp = {k: body[k] for k in SAMPLING_KEYS if body.get(k) is not None}
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    sp[P.MAX_NEW_TOKENS] = max_tokens if max_tokens is not None else P.DEFAULT_MAX_NEW_TOKENS
    if body.get("seed") is not None:
        sp[P.SAMPLING_SEED] = body["seed"]
    out = {P.SAMPLING_PARAMS: sp, P.STREAM: bool(body.get("stream", False)), P.RID: body.get(P.RID)}
    if input_ids is not None:
        out[P.INPUT_IDS] = input_ids
    else:
        out[P.TEXT] = text
    lp = body.get("logprobs")
    if lp:  # completions: int top-k; chat: bool + top_logprobs
        out[P.RETURN_LOGPROB] = True
        out[P.TOP_LOGPROBS_NUM] = body.get("top_logprobs") or (
            lp if isinstance(lp, int) and not isinstance(lp, bool) else 0
        )
    for k in (P.BOOTSTRAP_HOST, P.BOOTSTRAP_PORT, P.BOOTSTRAP_ROOM):
        if k in body:
            out[k] = body[k]
    return out


def _finish(fr: dict | None) -> str | None:
    if not fr:
        return None
    return {"length": "length", "stop": "stop"}.get(fr.get("type"), "abort")


def _usage(out: ReplyBuilder) -> dict:
    n, p = len(out.output_ids), out.req.prompt_len
    return {
        "prompt_tokens": p,
        "completion_tokens": n,
        "total_tokens": p + n,
        "prompt_tokens_details": {"cached_tokens": out.last.cached_tokens if out.last else 0},
    }


def _parse(st, body: object, chat: bool) -> tuple[Req, bool]:
    """The /generate request an OpenAI body asks for; BadRequestError (a 400) if it is wrong."""
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequestError("'messages' must be a non-empty list")
        for i, m in enumerate(msgs):
            if not (
                isinstance(m, dict)
                and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)
            ):
                raise BadRequestError(
                    f"messages[{i}] must be an object with a string 'role' and a string 'content'"
                )
        if st.tokenizer is None:
            raise BadRequestError("chat needs the tokenizer (worker runs --skip-tokenizer-init)")
        prompt = st.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids = st.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        gen = _generate_body(body, ids, None)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        is_ids = isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
        if not (isinstance(prompt, str) or is_ids):
            raise BadRequestError("'prompt' must be a string or a list of token ids")
        gen = _generate_body(body, prompt if is_ids else None, None if is_ids else prompt)
    return parse_generate(gen, st.engine.cfg, st.tokenizer)


@dataclass(slots=True)
class _Reply:
    """The OpenAI objects of one completion (chat or text), whole or as stream chunks."""

    chat: bool
    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def obj(self, choices: list[dict], chunk: bool = False, **extra) -> dict:
        kind = self.object + (".chunk" if chunk and self.chat else "")
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }

    def delta(self, text: str, finish_reason: str | None) -> dict:
        if self.chat:
            return {
                "index": 0,
                "delta": {"role": "assistant", "content": text},
                "finish_reason": finish_reason,
                "logprobs": None,
            }
        return {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}

    def whole(self, text: str, finish_reason: str | None, matched) -> dict:
        body = {"message": {"role": "assistant", "content": text}} if self.chat else {"text": text}
        return {
            "index": 0,
            **body,
            "logprobs": None,
            "finish_reason": finish_reason,
            "matched_stop": matched,
        }


async def _stream(
    request: web.Request, req: Req, out: ReplyBuilder, reply: _Reply, include_usage: bool
) -> web.StreamResponse:
    """SSE chunks as tokens come; a failure before the first chunk is a plain JSON error."""
    st = request.app[STATE]
    resp, sent_text = None, ""
    async with contextlib.aclosing(iter_outputs(st.engine, req, request)) as chunks:
        async for chunk in chunks:
            out.add(chunk)
            if chunk.status != 200:
                message = chunk.finish_reason.get("message", "failed")
                if resp is None:
                    return error(chunk.status, message)
                await resp.write(P.sse_error(message, chunk.status))
                await resp.write(P.sse_done())  # clients wait for it even after an error
                break
            if resp is None:
                resp = web.StreamResponse(headers={"Content-Type": P.SSE_CONTENT_TYPE})
                await resp.prepare(request)
            text = out.text(final=chunk.finished)
            if not chunk.finished and req.sampling.stop:
                # Hold back what could be the start of a stop string: it is cut from the final
                # text, so it must not be streamed before the match is known.
                text = text[: max(len(sent_text), len(text) - max(map(len, req.sampling.stop)) + 1)]
            delta, sent_text = text[len(sent_text) :], text
            choice = reply.delta(delta, _finish(chunk.finish_reason))
            try:
                await resp.write(P.sse_event(reply.obj([choice], chunk=True)))
                if chunk.finished:
                    if include_usage:
                        await resp.write(P.sse_event(reply.obj([], usage=_usage(out))))
                    await resp.write(P.sse_done())
            except ConnectionError:
                return resp
    return resp if resp is not None else error(499, "client disconnected")


async def _whole(request: web.Request, req: Req, out: ReplyBuilder, reply: _Reply) -> web.Response:
    """One JSON completion once the request finished."""
    st = request.app[STATE]
    async with contextlib.aclosing(iter_outputs(st.engine, req, request)) as chunks:
        async for chunk in chunks:
            out.add(chunk)
            if chunk.status != 200:
                return error(chunk.status, chunk.finish_reason.get("message", "failed"))
    if out.last is None:
        return error(499, "client disconnected")
    fr = out.last.finish_reason
    choice = reply.whole(out.text(final=True), _finish(fr), (fr or {}).get("matched"))
    return web.json_response(reply.obj([choice], usage=_usage(out)))


async def _run(request: web.Request, chat: bool) -> web.StreamResponse:
    st = request.app[STATE]
    try:
        body = await json_body(request)
        req, stream = _parse(st, body, chat)
    except BadRequestError as e:
        return error(400, str(e))
    reply = _Reply(
        chat, f"{'chatcmpl' if chat else 'cmpl'}-{req.rid}", body.get("model") or st.args.model_name
    )
    out = ReplyBuilder(req, st.tokenizer)
    if stream:
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        return await _stream(request, req, out, reply, include_usage)
    return await _whole(request, req, out, reply)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _run(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _run(request, chat=True)


async def models(request: web.Request) -> web.Response:
    st = request.app[STATE]
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": st.args.model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "sglang",
                    "root": st.args.model_name,
                    "max_model_len": st.engine.cfg.context_length,
                }
            ],
        }
    )


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
