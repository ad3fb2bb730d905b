"""KVReceiver: the decode side of one request's KV transfer (one per bootstrap room).

Created by the engine's decode queue, which preallocates the pages and calls init(dst_ranges);
polled on every scheduler step. Network work runs on the manager's loop thread; state changes
under the manager's lock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import aiohttp

from sglang_ext.disagg.control import ControlError, Destination, post_abort, post_destination
from sglang_ext.disagg.poll import KVPoll
from sglang_ext.disagg.ranges import Range, check_ranges_within

if TYPE_CHECKING:
    from sglang_ext.disagg.manager import KVManager

logger = logging.getLogger(__name__)

# What an HTTP exchange with the prefill side can raise (RuntimeError: a non-200 answer).
_HTTP_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, RuntimeError, KeyError, ValueError)


def _refused(e: Exception) -> bool:
    """post_destination's error for a 4xx answer: prefill did not take the destination."""
    return isinstance(e, ControlError) and 400 <= e.status < 500


def parse_bootstrap_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(
            f"bootstrap_addr must be 'host:port' of the prefill's bootstrap server, got {addr!r}"
        )
    return host, int(port)


class KVReceiver:
    def __init__(self, mgr: KVManager, bootstrap_addr: str, bootstrap_room: int) -> None:
        if mgr.mode != "decode":
            raise ValueError("a KVReceiver needs a decode KVManager")
        parse_bootstrap_addr(bootstrap_addr)
        self.mgr = mgr
        self.bootstrap_addr = bootstrap_addr
        self.room = bootstrap_room
        self.failure_reason: str | None = None
        self.timed_out = False  # failed because a peer or the KV did not come in time
        self._state = KVPoll.Bootstrapping
        self._aux: dict | None = None
        self._deadline: float | None = None  # set by init()
        self._dest_unsent = False  # the handshake failed before the destination was posted
        self._abort_acked = False  # prefill answered our /kv_abort: it will not WRITE any more
        mgr._attach_receiver(self)

    def init(self, dst_ranges: list[Range]) -> None:
        """Send this room's destination to the prefill rank (in the background)."""
        check_ranges_within(dst_ranges, self.mgr.kv_buffer, "decode destination")
        with self.mgr.lock:
            if self._deadline is not None:
                raise RuntimeError(f"init() called twice for room {self.room}")
            self._deadline = time.monotonic() + self.mgr.bootstrap_timeout
            if self._state.is_done:
                return
        self.mgr.notif_poller.wake()
        dest = Destination(
            self.room, self.mgr.backend.name, self.mgr.backend.metadata(), list(dst_ranges)
        )
        self.mgr.loop.submit(self._handshake(dest))

    @property
    def initialized(self) -> bool:
        """init() was called: the destination is (being) sent and KV may arrive."""
        return self._deadline is not None

    @property
    def writes_possible(self) -> bool:
        """Prefill may still WRITE into this room's destination pages: init() was called, the
        KV did not arrive, and prefill neither refused the destination nor acknowledged an
        abort. Decode keeps such pages out of its pool (a late WRITE would corrupt a reuse)."""
        with self.mgr.lock:
            return (
                self._deadline is not None
                and self._state != KVPoll.Success
                and not self._dest_unsent
                and not self._abort_acked
            )

    def poll(self) -> KVPoll:
        with self.mgr.lock:
            if self._state.is_done:
                return self._state
            self.mgr._drain_notifs()
            if not self._state.is_done and self._deadline and time.monotonic() > self._deadline:
                self.timed_out = True
                if self._state == KVPoll.Bootstrapping:
                    self._fail(
                        f"handshake for room {self.room} with prefill bootstrap "
                        f"http://{self.bootstrap_addr} not done within "
                        f"{self.mgr.bootstrap_timeout:.0f} s (bootstrap timeout)"
                    )
                else:
                    self._fail(
                        f"no KV for room {self.room} from prefill bootstrap "
                        f"http://{self.bootstrap_addr} within "
                        f"{self.mgr.waiting_timeout:.0f} s (waiting timeout)"
                    )
            return self._state

    def aux(self) -> dict:
        """What prefill sent with the KV (first token, logprobs, cached_tokens, ...)."""
        if self._aux is None:
            raise RuntimeError(f"room {self.room} has no aux data before poll() says Success")
        return self._aux

    def abort(self) -> None:
        with self.mgr.lock:
            if self._state == KVPoll.Success:
                return
            if self._state != KVPoll.Failed:
                self._fail(f"room {self.room} aborted by decode")
        # Tell prefill even if it never saw our destination: it tombstones the room, so a
        # destination still in flight is refused and its sender stops waiting.
        self.mgr.loop.submit(self._abort_remote())

    # --- loop thread ---------------------------------------------------------------------------
    async def _handshake(self, dest: Destination) -> None:
        step = f"GET http://{self.bootstrap_addr}/route"
        posted = False
        try:
            url = await self.mgr._control_url(self.bootstrap_addr)
            step = f"POST {url}/kv_dest"
            posted = True
            await post_destination(self.mgr.session, url, dest)
        except _HTTP_ERRORS as e:
            self.mgr._forget_route(self.bootstrap_addr)
            with self.mgr.lock:
                self._dest_unsent = not posted or _refused(e)
                if not self._state.is_done:
                    self._fail(f"room {self.room}: {step} failed: {e!r}")
            return
        with self.mgr.lock:
            if self._state == KVPoll.Bootstrapping:
                self._state = KVPoll.WaitingForInput
                self._deadline = time.monotonic() + self.mgr.waiting_timeout

    async def _abort_remote(self) -> None:
        try:
            await post_abort(
                self.mgr.session, await self.mgr._control_url(self.bootstrap_addr), self.room
            )
            with self.mgr.lock:
                self._abort_acked = True
        except _HTTP_ERRORS as e:  # prefill gone or unreachable: its own timeout frees the room
            logger.info(
                "could not tell prefill %s about abort of room %d: %r",
                self.bootstrap_addr,
                self.room,
                e,
            )

    # --- called with mgr.lock held -------------------------------------------------------------
    def _on_notif(self, msg: dict) -> None:
        if self._state.is_done:
            return
        if msg.get("ok"):
            self._aux = dict(msg.get("aux") or {})
            self._state = KVPoll.Success
            self.mgr._detach_receiver(self)
        else:
            self._fail(f"prefill failed room {self.room}: {msg.get('reason', 'no reason given')}")

    def _fail(self, reason: str) -> None:
        logger.warning("KV receiver failed: %s", reason)
        self.failure_reason = reason
        self._state = KVPoll.Failed
        self.mgr._detach_receiver(self)
