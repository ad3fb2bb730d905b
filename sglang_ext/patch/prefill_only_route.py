"""The `/prefill_only` route on SGLang's FastAPI app (all supported versions).

`sglang_ext.patch.apply` calls `install` in the server's main process before SGLang starts serving;
the verb itself (validation, fake-host body, reply) is `sglang_ext.prefill_only.serve`.
"""

import logging

from sglang_ext import protocol as P
from sglang_ext.prefill_only import serve

logger = logging.getLogger(__name__)

# The in-process ASGI call never touches the network; the host only fills the URL.
_INPROC_BASE_URL = "http://sglang-inproc"


def _httpx():
    # httpx comes with SGLang (through openai); httpx2 is its API-compatible successor that
    # huggingface_hub ships, which is what the CPU test environment has.
    try:
        import httpx
    except ImportError:
        import httpx2 as httpx
    return httpx


def install(app, dp_rank_field: str = P.ROUTED_DP_RANK) -> None:
    """Mount POST /prefill_only on `app` (SGLang's `srt/entrypoints/http_server.py::app`).

    The warm-up goes through the app's own POST /generate in process (httpx ASGITransport)
    instead of SGLang internals: /generate's JSON contract is the one thing stable from 0.5.3 to
    0.5.23, while the handler behind it (`generate_request`, `serve_generate_request`, the 0.5.23
    contract gate) changed shape. It also keeps every middleware (auth, metrics) in the path.
    """
    from fastapi import Request
    from fastapi.responses import JSONResponse

    httpx = _httpx()
    # One client for the process's life; ASGITransport holds no sockets, and timeout=None
    # because a long warm-up is bounded by SGLang's own scheduler, not by us.
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url=_INPROC_BASE_URL, timeout=None
    )

    async def generate(req: dict, headers: dict) -> tuple[int, object]:
        resp = await client.post("/generate", json=req, headers=headers)
        try:
            return resp.status_code, resp.json()
        except ValueError:  # not JSON: pass the text on as the error
            return resp.status_code, resp.text

    # This module has no `from __future__ import annotations` on purpose: FastAPI resolves the
    # `Request` annotation when the route is added, and a string naming a local import fails.
    async def prefill_only(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:  # json and orjson (0.5.23's ORJSONRequest) decode errors
            return JSONResponse(P.error_body("/prefill_only body is not valid JSON", 400), 400)
        # Forward credentials so --api-key servers accept the inner call as they did this one.
        headers = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
        status, reply = await serve(body, lambda req: generate(req, headers), dp_rank_field)
        if status != 200:
            logger.warning("/prefill_only -> %d: %s", status, reply)
        return JSONResponse(reply, status_code=status)

    app.add_api_route(P.PREFILL_ONLY_PATH, prefill_only, methods=["POST"])
