"""The shell router's optional API key, as SGLang and vLLM offer one: with a key, every route but
/health needs `Authorization: Bearer KEY` (401 otherwise). The key travels in a file of mode 0600
(`RUN_DIR/api_key`, written by `moa-pd up --api-key`) or in the environment (MOA_PD_API_KEY),
never on a command line, in a log or in cluster.json. Read by `python -m router`, the runner and
the soak; written by the launcher."""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from aiohttp import web

from router.api_errors import error_response

ENV_VAR = "MOA_PD_API_KEY"
KEY_FILE = "api_key"  # in the run folder
OPEN_PATHS = frozenset({"/health"})


class ApiKeyError(ValueError):
    """A key file that cannot be used; the message names it and the fix."""


def write_key_file(path: Path, key: str) -> Path:
    """`key` into `path`, readable by its owner only (created 0600, never world-readable even
    for a moment)."""
    if not key.strip():
        raise ApiKeyError("the API key is empty; give a non-empty --api-key or MOA_PD_API_KEY")
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(key.strip())
    return path


def read_key_file(path: str | Path) -> str:
    try:
        key = Path(path).read_text(encoding="utf-8").strip()
    except OSError as e:
        raise ApiKeyError(f"cannot read the API key file {path}: {e.strerror}") from None
    if not key:
        raise ApiKeyError(f"the API key file {path} is empty")
    return key


def key_from_env() -> str | None:
    return os.environ.get(ENV_VAR, "").strip() or None


def client_key(cluster: dict, cluster_path: str | Path | None = None) -> str | None:
    """The key a client of a deployment sends: the key file its cluster.json names (or that lies
    beside it), else MOA_PD_API_KEY, else none."""
    named = cluster.get("api_key_file")
    beside = Path(cluster_path).parent / KEY_FILE if cluster_path else None
    for path in (named, beside):
        if path and Path(path).is_file():
            return read_key_file(path)
    return key_from_env()


def auth_headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def has_key(request: web.Request, key: str | None) -> bool:
    """Whether `request` carries `Authorization: Bearer <key>` (True when there is no key).
    Compared in constant time."""
    if key is None:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), key.encode())


def require_key(key: str):
    """aiohttp middleware: 401 (OpenAI's `invalid_api_key`) for a request to any route but
    /health without `Authorization: Bearer <key>`."""

    @web.middleware
    async def _require_key(request: web.Request, handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS or has_key(request, key):
            return await handler(request)
        given = request.headers.get("Authorization", "").partition(" ")[2]
        message = (
            "invalid API key" if given else "this router needs an API key"
        ) + "; send the header 'Authorization: Bearer <key>' (the key given to `moa-pd up`)"
        return error_response(
            401,
            message,
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )

    return _require_key
