"""TransferBackend: what a KV transport must do for KVManager/KVSender/KVReceiver.

The state machines (manager.py, sender.py, receiver.py) are transport-agnostic; a backend only
moves registered bytes and notifications between named agents. nixl_transfer.py implements it;
KVManager (manager.py, `make_backend`) picks the implementation.
"""

from __future__ import annotations

import abc
import enum

from sglang_ext.disagg.ranges import Range


class XferState(enum.Enum):
    PROC = "PROC"
    DONE = "DONE"
    ERR = "ERR"


class TransferBackend(abc.ABC):
    """One agent per worker with the whole KV pool registered. Implementations are thread-safe."""

    name: str  # this agent's name, unique per process lifetime

    @abc.abstractmethod
    def metadata(self) -> bytes:
        """What a peer needs (add_peer) to write into this agent's memory or notify it."""

    @abc.abstractmethod
    def add_peer(self, name: str, metadata: bytes) -> None:
        """Make `name` reachable; a no-op when it is known already."""

    @abc.abstractmethod
    def write(self, src: list[Range], dst: list[Range], peer: str, notif: bytes) -> object:
        """Start one WRITE of local src ranges to the peer's dst ranges (paired one to one);
        `notif` reaches the peer after the data. Returns a handle for check/release."""

    @abc.abstractmethod
    def check(self, handle: object) -> XferState: ...

    @abc.abstractmethod
    def release(self, handle: object) -> None:
        """Free the handle (aborts the transfer if it still runs, where the transport can)."""

    @abc.abstractmethod
    def send_notif(self, peer: str, msg: bytes) -> None: ...

    @abc.abstractmethod
    def get_notifs(self) -> list[bytes]:
        """Notifications received since the last call, from any peer."""

    @abc.abstractmethod
    def close(self) -> None: ...
