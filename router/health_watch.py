"""The shell router's watch over its deployment: every worker and native router is probed each
second (and, where the launcher recorded its pid, checked for having exited), so a dead or hung
process is noticed in seconds, not after a 300 s read timeout. Sessions that need a down model
fail at once with a message naming the process and its log file; `/health` turns non-200.
Started by server.py; `check` and `watch` are called by the API and the orchestrator."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from router.cluster import ClusterSpec, create_time

log = logging.getLogger(__name__)


class WorkerDown(RuntimeError):
    """A process a request needs is down; the message names it and its log file (HTTP 503)."""


@dataclass(slots=True)
class Endpoint:
    model: str
    role: str  # prefill0, decode0, router
    url: str
    log: str | None = None
    pid: int | None = None
    create_time: float | None = None
    misses: int = 0
    down: str | None = None  # why, once it counts as down
    down_at: float | None = None  # time.monotonic()

    def describe(self) -> str:
        where = f"; its log: {self.log}" if self.log else ""
        return f"{self.model} {self.role} at {self.url} is down ({self.down}){where}"


@dataclass
class HealthWatch:
    cluster: ClusterSpec
    # A hung worker is called down after `hung_misses` probes in a row time out: at most
    # interval + misses × (timeout + interval) ≈ 6.5 s with the reference engine's 2.5 s
    # (Timeouts.health_probe_s), leaving its requests time to fail within issue 13's 10 s on a
    # loaded machine; a busy reference engine still answers /health at once (its HTTP loop does
    # not wait for a forward). SGLang workers get a longer probe timeout, see Timeouts.
    interval_s: float = 0.5
    timeout_s: float = 2.5
    # A refused connection or an exited pid is down at once; a timeout (hung) after this many.
    hung_misses: int = 2
    endpoints: list[Endpoint] = field(default_factory=list)
    _listeners: set[Callable[[Endpoint], None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        for name, m in self.cluster.models.items():
            roles = [(f"prefill{i}", u) for i, u in enumerate(m.prefill_urls)]
            roles += [(f"decode{i}", u) for i, u in enumerate(m.decode_urls)]
            roles.append(("router", m.router_url))
            for role, url in roles:
                proc = m.processes.get(url)
                self.endpoints.append(
                    Endpoint(
                        name,
                        role,
                        url.rstrip("/"),
                        proc.log if proc else None,
                        proc.pid if proc else None,
                        proc.create_time if proc else None,
                    )
                )

    # --- queries ---------------------------------------------------------------------------------
    def down(self, models: set[str] | None = None) -> list[Endpoint]:
        return [e for e in self.endpoints if e.down and (models is None or e.model in models)]

    def is_down(self, url: str) -> bool:
        return any(e.down and e.url == url.rstrip("/") for e in self.endpoints)

    def check(self, models: set[str]) -> None:
        """Raise WorkerDown when a process of one of `models` is down."""
        if down := self.down(models):
            raise WorkerDown(
                "; ".join(e.describe() for e in down)
                + ". Restart the deployment (moa-pd down, moa-pd up)"
            )

    def down_since(self, models: set[str], since: float) -> list[Endpoint]:
        """Processes of `models` that went down at or after `since` (time.monotonic())."""
        return [e for e in self.down(models) if e.down_at is not None and e.down_at >= since]

    def status(self) -> list[dict]:
        return [
            {"model": e.model, "role": e.role, "url": e.url, "reason": e.down, "log": e.log}
            for e in self.down()
        ]

    def watch(self, listener: Callable[[Endpoint], None]) -> Callable[[], None]:
        """Call `listener(endpoint)` when a process goes down; returns the unsubscribe."""
        self._listeners.add(listener)
        return lambda: self._listeners.discard(listener)

    # --- probing ---------------------------------------------------------------------------------
    async def run(self) -> None:
        """Probe until cancelled. A process once down stays down: restarting a worker under
        the same address is a new deployment. Each probe opens a new connection: a kept-alive
        one could outlive the listening socket of a process that is going away."""
        connector = aiohttp.TCPConnector(force_close=True, limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            while True:
                await asyncio.gather(
                    *(self._probe(session, e) for e in self.endpoints if not e.down)
                )
                await asyncio.sleep(self.interval_s)

    async def _probe(self, session: aiohttp.ClientSession, e: Endpoint) -> None:
        if e.pid is not None and create_time(e.pid) != e.create_time:
            return self._mark(e, f"process {e.pid} exited")
        try:
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            async with session.get(f"{e.url}/health", timeout=timeout) as resp:
                await resp.read()
                ok = resp.status == 200
        except (TimeoutError, asyncio.TimeoutError):
            e.misses += 1
            if e.misses >= self.hung_misses:
                self._mark(
                    e,
                    f"no answer to /health within {self.timeout_s:g} s, "
                    f"{e.misses} times in a row (hung)",
                )
            return
        except aiohttp.ClientConnectorError as err:  # nothing listens there any more
            return self._mark(e, f"/health unreachable: {err.os_error or err}")
        except aiohttp.ClientError:
            ok = False
        if ok:
            e.misses = 0
        else:
            e.misses += 1
            if e.misses >= self.hung_misses:
                self._mark(e, f"/health failed {e.misses} times in a row")

    def _mark(self, e: Endpoint, reason: str) -> None:
        e.down, e.down_at = reason, time.monotonic()
        log.error("%s", e.describe())
        for listener in list(self._listeners):
            listener(e)
