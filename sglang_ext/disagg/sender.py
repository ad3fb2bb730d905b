"""KVSender: the prefill side of one request's KV transfer (one per bootstrap room).

Created by the engine's prefill queue; polled on every scheduler step. Its state changes under
the manager's lock, from the scheduler thread (poll/send/abort) and the manager's threads
(a destination arriving, a transfer being submitted).
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING

from sglang_ext.disagg.control import Destination
from sglang_ext.disagg.poll import KVPoll
from sglang_ext.disagg.ranges import Range, check_ranges_within
from sglang_ext.disagg.xfer_worker import XferJob
from sglang_ext.protocol import BOOTSTRAP_ROOM

if TYPE_CHECKING:
    from sglang_ext.disagg.manager import KVManager

logger = logging.getLogger(__name__)

# NIXL drops notifications of ~8 MB and more without an error (seen with nixl 1.5.1 / UCX), and
# the aux rides in one; real aux (a token, a few logprobs, counters) is well under 1 KB.
MAX_AUX_BYTES = 1 << 20


class KVSender:
    def __init__(self, mgr: KVManager, bootstrap_addr: str, bootstrap_room: int) -> None:
        if mgr.mode != "prefill":
            raise ValueError("a KVSender needs a prefill KVManager")
        self.mgr = mgr
        self.bootstrap_addr = bootstrap_addr
        self.room = bootstrap_room
        self.failure_reason: str | None = None
        self.timed_out = False  # failed because a peer or the KV did not come in time
        self._state = KVPoll.Bootstrapping
        self._dest: Destination | None = None
        self._payload: tuple[list[Range], bytes] | None = None  # send() before the destination
        self._job: XferJob | None = None
        self._deadline = time.monotonic() + mgr.bootstrap_timeout
        mgr._attach_sender(self)

    def poll(self) -> KVPoll:
        with self.mgr.lock:
            if not self._state.is_done and time.monotonic() > self._deadline:
                self.timed_out = True
                if self._state == KVPoll.Bootstrapping:
                    self._fail(
                        f"no destination for room {self.room} arrived from decode within "
                        f"{self.mgr.bootstrap_timeout:.0f} s (bootstrap timeout)"
                    )
                else:
                    self._fail(
                        f"KV transfer of room {self.room} not done within "
                        f"{self.mgr.waiting_timeout:.0f} s (waiting timeout)"
                    )
            return self._state

    def send(self, src_ranges: list[Range], aux: dict) -> None:
        """Start the one WRITE of this request's KV, with `aux` as its notification. Non-blocking.

        Called once the prefill is computed. If decode's destination has not arrived yet, poll()
        stays Bootstrapping and the transfer starts when it arrives.
        """
        check_ranges_within(src_ranges, self.mgr.kv_buffer, "prefill source")
        notif = json.dumps({BOOTSTRAP_ROOM: self.room, "ok": True, "aux": aux}).encode()
        if len(notif) > MAX_AUX_BYTES:
            raise ValueError(
                f"aux of room {self.room} is {len(notif)} bytes as JSON; keep it "
                f"under {MAX_AUX_BYTES} (it travels as one NIXL notification)"
            )
        with self.mgr.lock:
            if self._state.is_done:
                return  # aborted or failed meanwhile: poll() says so
            if self._payload is not None:
                raise RuntimeError(f"send() called twice for room {self.room}")
            self._payload = (list(src_ranges), notif)
            if self._dest is not None:
                self._start()

    def abort(self) -> None:
        with self.mgr.lock:
            if not self._state.is_done:
                self._fail(f"room {self.room} aborted by prefill")
            self.mgr._tombstone(self.room)

    # --- called with mgr.lock held -------------------------------------------------------------
    def _on_destination(self, dest: Destination) -> None:
        self._dest = dest
        if self._state == KVPoll.Bootstrapping:
            self._state = KVPoll.WaitingForInput
        if self._payload is not None:
            self._start()

    def _start(self) -> None:
        self._state = KVPoll.Transferring
        self._deadline = time.monotonic() + self.mgr.waiting_timeout
        src, notif = self._payload
        self._job = XferJob(
            src, self._dest.dst_ranges, self._dest.agent_name, notif, self._on_transfer_done
        )
        self.mgr.xfer.submit(self._job)

    def _on_transfer_done(self, error: str | None) -> None:
        """Transfer thread: the WRITE finished (error None) or could not be done."""
        with self.mgr.lock:
            if self._state.is_done:
                return
            if error is None:
                self._state = KVPoll.Success
                self.mgr._detach_sender(self)
            else:
                self._fail(f"room {self.room}: {error}")

    def _fail(self, reason: str) -> None:
        logger.warning("KV sender failed: %s", reason)
        self.failure_reason = reason
        self._state = KVPoll.Failed
        if self._job is not None:
            self._job.cancelled = True
        if self._dest is not None:  # tell decode now rather than let it wait for its timeout
            msg = {BOOTSTRAP_ROOM: self.room, "ok": False, "reason": reason}
            try:
                self.mgr.backend.send_notif(self._dest.agent_name, json.dumps(msg).encode())
            except Exception as e:  # noqa: BLE001 -- decode may be gone; its timeout covers it
                logger.warning("could not tell decode that room %d failed: %s", self.room, e)
        self.mgr._detach_sender(self)
