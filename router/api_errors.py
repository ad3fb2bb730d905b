"""Error replies of the shell router's HTTP API, in OpenAI's shape (`{"error": {"message", "type",
"param", "code"}}`, plus SGLang's top-level `message`), with every internal address taken out:
a client learns what went wrong and how to fix it, never where the workers listen. Used by
server.py, chat_api.py and api_key.py."""

from __future__ import annotations

import re
from collections.abc import Iterable

from aiohttp import web

from sglang_ext import protocol as P

# Internal addresses a message may carry (a worker's error text, an aiohttp exception): URLs,
# IPv4 addresses and localhost, each with an optional port, aiohttp's "host H:P" and a socket
# address tuple ('H', P).
_ADDRESS = re.compile(
    r"\('[^']*', \d+\)"
    r"|\b[a-z][a-z0-9+.-]*://[^\s'\"<>)\]]+"
    r"|\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b"
    r"|\blocalhost(?::\d+)?\b"
    r"|(?<=host )[\w.-]+:\d+",
    re.IGNORECASE,
)
HIDDEN = "<internal>"


def scrub(message: str, addresses: Iterable[str] = ()) -> str:
    """`message` with the given addresses (the cluster's URLs) and anything shaped like one
    replaced by <internal>."""
    for a in sorted(addresses, key=len, reverse=True):
        if a:
            message = message.replace(a, HIDDEN)
    return _ADDRESS.sub(HIDDEN, message)


def error_body(
    status: int,
    message: str,
    type: str | None = None,
    param: str | None = None,
    code: str | int | None = None,
) -> dict:
    """OpenAI's error object; `code` defaults to the HTTP status, as SGLang sends it."""
    body = P.error_body(message, status)
    body["error"].update(
        type=type or ("invalid_request_error" if status < 500 else "server_error"),
        param=param,
        code=status if code is None else code,
    )
    return body


def error_response(
    status: int,
    message: str,
    addresses: Iterable[str] = (),
    type: str | None = None,
    param: str | None = None,
    code: str | int | None = None,
    headers: dict | None = None,
) -> web.Response:
    body = error_body(status, scrub(message, addresses), type, param, code)
    return web.json_response(body, status=status, headers=headers)


def sse_error(message: str, status: int, addresses: Iterable[str] = ()) -> bytes:
    """A stream's error event (protocol.sse_error) with internal addresses taken out."""
    return P.sse_error(scrub(message, addresses), status)


def internal_addresses(urls: Iterable[str]) -> list[str]:
    """Each URL and its host:port, for `scrub`."""
    out = []
    for u in urls:
        out += [u, u.split("://", 1)[-1]]
    return out
