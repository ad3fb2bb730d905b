"""The runner's view of the shell router: one aiohttp session (with the deployment's API key,
if it has one), the registration of the configs a run sends, one call per question graph."""

from __future__ import annotations

import asyncio
import hashlib
import json

import aiohttp
from typing_extensions import Self

from router.api_key import auth_headers


class GraphRunError(RuntimeError):
    """A question's graph failed; the message names the stage and the cause."""


class RouterClient:
    def __init__(self, base_url: str, timeout_s: float = 1800.0, api_key: str | None = None):
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._headers = auth_headers(api_key)
        self._session: aiohttp.ClientSession | None = None
        self._no_stats = False  # the router has no /v1/moa/stats

    async def __aenter__(self) -> Self:
        self._session = aiohttp.ClientSession(timeout=self._timeout, headers=self._headers)
        return self

    async def __aexit__(self, *exc) -> None:
        if self._session:
            await self._session.close()

    async def register(self, config: dict) -> str:
        """Have the shell router serve `config` (a topology config object); returns the name
        to run it by: its own, or, when the router serves another config under that name (an
        edited copy, a sweep's chunk-policy variant), the name plus a digest of its content."""
        status, payload = await self._post("/v1/moa/configs", config)
        if status == 409:
            digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
            config = {**config, "name": f"{config['name']}@{digest[:12]}"}
            status, payload = await self._post("/v1/moa/configs", config)
        if status not in (200, 201):
            raise GraphRunError(
                f"registering config '{config.get('name')}': shell router answered {status}: "
                f"{_message(payload)}"
            )
        return config["name"]

    async def _post(self, path: str, body: dict) -> tuple[int, dict | None]:
        url = f"{self.base_url}{path}"
        try:
            async with self._session.post(url, json=body) as resp:
                return resp.status, await resp.json(content_type=None)
        except (aiohttp.ClientError, ValueError) as e:
            raise GraphRunError(f"shell router at {url} unreachable: {e}") from None

    async def run_graph(
        self,
        question: str,
        question_id: str,
        config: str,
        mode: str,
        early_exit: bool,
        dataset: str | None = None,
        task: str | None = None,
    ) -> dict:
        """POST the whole graph; returns {answer, agents, early_exit, e2e_s, ...}. `config` is a
        served config's name (`register` serves a config file's). `dataset` (and BBH's `task`)
        let the router's majority vote use that dataset's extractor."""
        body = {
            "question": question,
            "question_id": question_id,
            "config": config,
            "mode": mode,
            "early_exit": early_exit,
        }
        body.update({k: v for k, v in (("dataset", dataset), ("task", task)) if v})
        url = f"{self.base_url}/v1/moa/run"
        try:
            async with self._session.post(url, json=body) as resp:
                payload = await resp.json(content_type=None)
                if resp.status != 200:
                    raise GraphRunError(f"shell router answered {resp.status}: {_message(payload)}")
                return payload
        except aiohttp.ClientError as e:
            raise GraphRunError(f"shell router at {url} unreachable: {e}") from None

    async def stats(self) -> dict | None:
        """The shell router's load counters (`GET /v1/moa/stats`: CPU seconds, event-loop lag
        histogram), or None when it cannot say: a router that predates the endpoint (asked no
        more after its 404), a reply that is not one, no answer within a minute. Never raises:
        a question's measurement does not depend on it."""
        if self._no_stats:
            return None
        url = f"{self.base_url}/v1/moa/stats"
        try:
            async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=60)) as resp:
                if resp.status == 404:
                    self._no_stats = True
                    return None
                body = await resp.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, TimeoutError, ValueError):
            return None
        if resp.status != 200 or not isinstance(body, dict) or "event_loop_lag" not in body:
            return None
        return body

    async def deployment_down(self) -> str | None:
        """None while the shell router reports its deployment healthy, else what is down (each
        process and its log file), or that the shell router itself does not answer."""
        url = f"{self.base_url}/health"
        try:
            async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as resp:
                body = await resp.json(content_type=None)
                if resp.status == 200:
                    return None
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            return f"the shell router at {self.base_url} does not answer ({type(e).__name__})"
        down = (body or {}).get("down") or []
        return (
            "; ".join(
                f"{d['model']} {d['role']} at {d['url']} is down ({d['reason']})"
                + (f"; its log: {d['log']}" if d.get("log") else "")
                for d in down
            )
            or f"the shell router's /health answered {resp.status}"
        )

    async def post_json(self, url: str, body: dict) -> int:
        async with self._session.post(url, json=body) as resp:
            await resp.read()
            return resp.status


def _message(payload: object) -> str:
    """The message of an error reply (OpenAI's shape)."""
    error = (payload or {}).get("error", {}) if isinstance(payload, dict) else payload
    return str(error.get("message") if isinstance(error, dict) else error)
