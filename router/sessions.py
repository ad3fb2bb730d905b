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
    """Live per-agent sessions by id, how many requests are inside each, and their expiry."""

    def __init__(self, ctx: RouterContext) -> None:
        self._ctx = ctx
        self._sessions: dict[str, Session] = {}
        self._active: dict[str, int] = {}
        self._expiry: dict[str, asyncio.TimerHandle] = {}
        # Closes of expired sessions still running: tracked so none is garbage-collected mid-way
        # and `close` can wait for them.
        self._closing: set[asyncio.Task] = set()

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
        if self._sessions.get(sid) is not session:
            return  # already expired or closed with the store; nothing left to count
        self._active[sid] -= 1
        if self._active[sid] > 0:
            return
        all_ended = len(session.tasks) == len(session.cfg.agents) and all(
            t.done() for t in session.tasks.values()
        )
        if all_ended:
            self._pop(sid).release()
        else:
            self._expiry[sid] = asyncio.get_running_loop().call_later(
                self._ctx.timeouts.session_linger_s, self._expire, sid
            )

    def _expire(self, sid: str) -> None:
        self._expiry.pop(sid, None)
        if sid not in self._sessions or self._active.get(sid, 0) > 0:
            return
        log.info("session %s expired with agents missing or running", sid)
        # Out of the store first: a request arriving during the close starts a fresh session.
        task = asyncio.create_task(_end(self._pop(sid)), name=f"expire:{sid}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _pop(self, sid: str) -> Session:
        self._active.pop(sid, None)
        return self._sessions.pop(sid)

    async def close(self) -> None:
        """Shut down: cancel every session's agents (aborting their requests) and release them."""
        for h in self._expiry.values():
            h.cancel()
        self._expiry.clear()
        sessions = [self._pop(sid) for sid in list(self._sessions)]
        for s in sessions:
            await _end(s)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


async def _end(session: Session) -> None:
    await session.close()
    session.release()
