"""Sessions of the per-agent endpoint: a driver fires every agent of a question at once, each as its
own request with the same session id, and they meet here. A session is released once all its
agents ended, or `session_linger_s` after its last request when some never came."""

from __future__ import annotations

import asyncio
import logging

from router.config import TopologyConfig
from router.context import RouterContext
from router.orchestrator import Mode, Session

log = logging.getLogger(__name__)


class SessionConflict(ValueError):
    """A request names an existing session with another config, question or mode."""


class SessionStore:
    def __init__(self, ctx: RouterContext) -> None:
        self._ctx = ctx
        self._sessions: dict[str, Session] = {}
        self._active: dict[str, int] = {}
        self._expiry: dict[str, asyncio.TimerHandle] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def enter(self, session_id: str, cfg: TopologyConfig, question: str, mode: Mode) -> Session:
        """The session for `session_id` (created on first use); pair with `leave`."""
        s = self._sessions.get(session_id)
        if s is None:
            s = Session(self._ctx, cfg, question, mode, session_id)
            self._sessions[session_id] = s
            self._active[session_id] = 0
        elif (s.cfg.name, s.question, s.mode) != (cfg.name, question, mode):
            raise SessionConflict(
                f"session '{session_id}' already runs config '{s.cfg.name}' in {s.mode} mode on "
                "another question; use a fresh session id per question"
            )
        if (h := self._expiry.pop(session_id, None)) is not None:
            h.cancel()
        self._active[session_id] += 1
        return s

    def leave(self, session: Session) -> None:
        sid = session.id
        self._active[sid] -= 1
        if self._active[sid] > 0:
            return
        all_ended = len(session.tasks) == len(session.cfg.agents) and all(
            t.done() for t in session.tasks.values()
        )
        if all_ended:
            self._drop(sid)
        else:
            loop = asyncio.get_running_loop()
            self._expiry[sid] = loop.call_later(
                self._ctx.timeouts.session_linger_s, lambda: loop.create_task(self._expire(sid))
            )

    async def _expire(self, sid: str) -> None:
        self._expiry.pop(sid, None)
        s = self._sessions.get(sid)
        if s is not None and self._active.get(sid, 0) == 0:
            log.info("session %s expired with agents missing or running", sid)
            await s.close()
            self._drop(sid)

    def _drop(self, sid: str) -> None:
        s = self._sessions.pop(sid)
        self._active.pop(sid, None)
        s.release()

    async def close(self) -> None:
        for h in self._expiry.values():
            h.cancel()
        for s in list(self._sessions.values()):
            await s.close()
            self._drop(s.id)
