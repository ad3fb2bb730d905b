"""FakeKVSender / FakeKVReceiver: the transfer that moves nothing, as SGLang's fake backend.

The prefill queue uses FakeKVSender for requests whose bootstrap_host is FAKE_BOOTSTRAP_HOST
(prefill-only warm-ups); tests use both as doubles of KVSender / KVReceiver.
"""

from __future__ import annotations

from sglang_ext.disagg.poll import KVPoll
from sglang_ext.disagg.ranges import Range


class FakeKVSender:
    """WaitingForInput at once (no decode peer), Success right after send()."""

    def __init__(self, mgr: object, bootstrap_addr: str, bootstrap_room: int) -> None:
        self.mgr = mgr  # unused; kept so that it is built exactly like KVSender
        self.bootstrap_addr = bootstrap_addr
        self.room = bootstrap_room
        self.failure_reason: str | None = None
        self._state = KVPoll.WaitingForInput

    def poll(self) -> KVPoll:
        return self._state

    def send(self, src_ranges: list[Range], aux: dict) -> None:
        if self._state == KVPoll.WaitingForInput:
            self._state = KVPoll.Success

    def abort(self) -> None:
        if self._state != KVPoll.Success:
            self.failure_reason = f"room {self.room} aborted by prefill"
            self._state = KVPoll.Failed


class FakeKVReceiver:
    """Success right after init(); aux() returns what the test gave it."""

    def __init__(
        self, mgr: object, bootstrap_addr: str, bootstrap_room: int, aux: dict | None = None
    ) -> None:
        self.mgr = mgr
        self.bootstrap_addr = bootstrap_addr
        self.room = bootstrap_room
        self.failure_reason: str | None = None
        self._aux = dict(aux or {})
        self._state = KVPoll.Bootstrapping

    def init(self, dst_ranges: list[Range]) -> None:
        if self._state == KVPoll.Bootstrapping:
            self._state = KVPoll.Success

    def poll(self) -> KVPoll:
        return self._state

    def aux(self) -> dict:
        if self._state != KVPoll.Success:
            raise RuntimeError(f"room {self.room} has no aux data before poll() says Success")
        return self._aux

    def abort(self) -> None:
        if self._state != KVPoll.Success:
            self.failure_reason = f"room {self.room} aborted by decode"
            self._state = KVPoll.Failed
