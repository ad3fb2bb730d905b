"""HTTP calls to SGLang-speaking servers (workers and native sglang-routers) over the process's one
aiohttp ClientSession: streamed /generate with SSE parsing, plain JSON posts and gets, aborts.
Every failure becomes a WorkerError naming the stage (and, for logs only, the URL). Used by pd.py
and context.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterator

import aiohttp

from sglang_ext import protocol as P

log = logging.getLogger(__name__)


class WorkerError(RuntimeError):
    """A request to a worker or router failed; str() says which stage and why, `url` where (for
    the router's log: a client is never shown an internal address). `status`: the worker's
    HTTP status when it answered one."""

    def __init__(self, stage: str, url: str, message: str, status: int | None = None) -> None:
        super().__init__(f"{stage} request failed: {message}")
        self.stage, self.url, self.status, self.reason = stage, url, status, message

    @property
    def refused(self) -> bool:
        """The worker refused the request as invalid (a 4xx other than 429): the request, not
        the deployment, is at fault, e.g. a prompt over the model's context."""
        return self.status is not None and 400 <= self.status < 500 and self.status != 429


@contextlib.contextmanager
def _failures(stage: str, url: str, timeout_message: str) -> Iterator[None]:
    """Turn every way a call can fail (timeout, connection, bad reply) into a WorkerError that
    names the stage and the URL."""
    try:
        yield
    except WorkerError:
        raise
    except asyncio.TimeoutError as e:
        raise WorkerError(stage, url, timeout_message) from e
    except aiohttp.ClientConnectorError as e:
        raise WorkerError(stage, url, f"cannot connect ({e.os_error}); is the worker up?") from e
    except (aiohttp.ClientError, json.JSONDecodeError) as e:
        raise WorkerError(stage, url, f"{type(e).__name__}: {e}") from e


class SGLangClient:
    def __init__(self, session: aiohttp.ClientSession, connect_s: float, read_s: float) -> None:
        self._session = session
        self._connect_s = connect_s
        self._read_s = read_s

    def _timeout(self, total: float | None) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(
            total=total, sock_connect=self._connect_s, sock_read=self._read_s
        )

    async def stream(self, url: str, body: dict, stage: str) -> AsyncIterator[dict]:
        """POST `body` (with stream=true) and yield each SSE event's JSON until [DONE]."""
        body = {**body, P.STREAM: True}
        silence = (
            f"no data for {self._read_s:g}s (worker hanging? raise timeouts.read_s if it is "
            "just slow)"
        )
        with _failures(stage, url, silence):
            async with self._session.post(url, json=body, timeout=self._timeout(None)) as resp:
                await _raise_for_status(resp, stage, url)
                async for event in _sse_events(resp):
                    if "error" in event:
                        err = event["error"]
                        msg = err.get("message", err) if isinstance(err, dict) else err
                        raise WorkerError(stage, url, f"error in stream: {msg}")
                    yield event

    async def post_json(self, url: str, body: dict, stage: str, total_s: float) -> dict:
        """POST a JSON body, return the JSON reply (an SSE reply gives its last event)."""
        with _failures(stage, url, f"no reply within {total_s:g}s"):
            async with self._session.post(url, json=body, timeout=self._timeout(total_s)) as resp:
                await _raise_for_status(resp, stage, url)
                if resp.content_type == P.SSE_CONTENT_TYPE:
                    last: dict = {}
                    async for event in _sse_events(resp):
                        last = event
                    return last
                return await resp.json(content_type=None)

    async def get_json(self, url: str, stage: str, total_s: float) -> dict:
        with _failures(stage, url, f"no reply within {total_s:g}s"):
            async with self._session.get(url, timeout=self._timeout(total_s)) as resp:
                await _raise_for_status(resp, stage, url)
                return await resp.json(content_type=None)

    async def abort(self, base_url: str, rid: str, total_s: float) -> None:
        """Best effort: ask a worker to drop request `rid` (logged, never raised)."""
        url = f"{base_url}/abort_request"
        try:
            async with self._session.post(
                url, json={P.RID: rid}, timeout=self._timeout(total_s)
            ) as resp:
                await resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            log.warning("abort %s at %s failed: %s", rid, url, e)


async def _raise_for_status(resp: aiohttp.ClientResponse, stage: str, url: str) -> None:
    if resp.status < 300:
        return
    text = (await resp.text())[:500]
    try:
        msg = json.loads(text).get("error", {}).get("message") or text
    except (json.JSONDecodeError, AttributeError):
        msg = text
    raise WorkerError(stage, url, f"HTTP {resp.status}: {msg}", status=resp.status)


async def _sse_events(resp: aiohttp.ClientResponse) -> AsyncIterator[dict]:
    """SSE events of a response. Reads raw chunks: an event with cumulative text and logprobs can
    outgrow aiohttp's line-length limit."""
    buf = b""
    async for chunk in resp.content.iter_any():
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip() == f"{P.SSE_DATA_PREFIX}{P.SSE_DONE}".encode():
                return
            event = P.parse_sse_line(line.decode())
            if event is not None:
                yield event
    if buf.strip() and (event := P.parse_sse_line(buf.decode())) is not None:
        yield event
