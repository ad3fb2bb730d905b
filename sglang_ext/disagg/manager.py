"""KVManager: one per worker process; owns the transfer backend, the threads and the room tables.

Prefill: registers its control listener with its BootstrapServer and matches destinations that
decode sends to the KVSender of the same bootstrap room. Decode: resolves prefill ranks and
routes incoming notifications to KVReceivers. Created by the engine at start-up.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING, Literal

import aiohttp
import torch

from sglang_ext.disagg.bootstrap import BootstrapServer, get_route, put_route
from sglang_ext.disagg.control import ControlListener, Destination
from sglang_ext.disagg.loop_thread import LoopThread
from sglang_ext.disagg.nixl_transfer import NixlBackend
from sglang_ext.disagg.notif_poller import NotifPoller
from sglang_ext.disagg.ranges import check_kv_buffer
from sglang_ext.disagg.transfer import TransferBackend
from sglang_ext.disagg.xfer_worker import TransferWorker
from sglang_ext.protocol import BOOTSTRAP_ROOM

if TYPE_CHECKING:
    from sglang_ext.disagg.receiver import KVReceiver
    from sglang_ext.disagg.sender import KVSender

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 300.0  # SGLang's default for both timeouts
_WILDCARD_HOSTS = ("", "0.0.0.0", "::")


class RoomInUseError(ValueError):
    """A bootstrap_room that already has a live sender/receiver on this worker (a client bug)."""


def make_backend(backend: str, name: str, kv_buffer: torch.Tensor, host: str) -> TransferBackend:
    """The transport `backend` names. NixlBackend imports the nixl wheel only when created."""
    if backend == "nixl":
        return NixlBackend(name, kv_buffer, host=host)
    raise ValueError(f"unknown KV transfer backend {backend!r}: use 'nixl'")


def _timeout(explicit: float | None, env: str) -> float:
    return float(explicit if explicit is not None else os.environ.get(env, DEFAULT_TIMEOUT_S))


class KVManager:
    def __init__(
        self,
        mode: Literal["prefill", "decode"],
        kv_buffer: torch.Tensor,
        *,
        host: str,
        bootstrap_port: int | None,
        page_size: int,
        backend: str = "nixl",
        bootstrap_timeout: float | None = None,
        waiting_timeout: float | None = None,
    ) -> None:
        """bootstrap_port: prefill serves its BootstrapServer there (None: a free port, read it
        from .bootstrap_port); decode only keeps it, as SGLang's default prefill port.
        Timeouts default to SGLang's env vars SGLANG_DISAGGREGATION_{BOOTSTRAP,WAITING}_TIMEOUT,
        else 300 s as SGLang (the engine passes its own EngineConfig values): bootstrap = waiting
        for the peer's half of the handshake, waiting = for the KV.
        """
        if mode not in ("prefill", "decode"):
            raise ValueError(f"KVManager mode must be 'prefill' or 'decode', got {mode!r}")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        check_kv_buffer(kv_buffer)
        self.mode, self.kv_buffer, self.host, self.page_size = mode, kv_buffer, host, page_size
        self.bootstrap_timeout = _timeout(
            bootstrap_timeout, "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"
        )
        self.waiting_timeout = _timeout(waiting_timeout, "SGLANG_DISAGGREGATION_WAITING_TIMEOUT")
        # Guards the tables below and the state of every KVSender/KVReceiver of this manager.
        self.lock = threading.Lock()
        self._closed = False
        self.senders: dict[int, KVSender] = {}
        self.receivers: dict[int, KVReceiver] = {}
        self._pending: dict[int, tuple[Destination, float]] = {}  # destination before its sender
        self._tombstones: dict[
            int, float
        ] = {}  # aborted rooms -> expiry; late destinations refused
        self._routes: dict[str, str] = {}  # decode: bootstrap addr -> prefill control URL
        self.backend = make_backend(backend, f"{mode}-{uuid.uuid4().hex[:12]}", kv_buffer, host)
        self.loop = LoopThread(f"kv-{mode}")
        self.session: aiohttp.ClientSession = self.loop.run(self._open_session(), timeout=10)
        self.bootstrap_server: BootstrapServer | None = None
        self.control: ControlListener | None = None
        self.bootstrap_port: int | None = bootstrap_port
        self.xfer: TransferWorker | None = None
        self.notif_poller: NotifPoller | None = None
        if mode == "decode":
            self.notif_poller = NotifPoller(self._poll_notifs, "kv-notifs")
        if mode == "prefill":
            try:
                self._start_prefill(bootstrap_port or 0)
            except BaseException:
                self.close()
                raise

    async def _open_session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.bootstrap_timeout))

    def _start_prefill(self, bootstrap_port: int) -> None:
        self.xfer = TransferWorker(self.backend, "kv-xfer")
        self.control = ControlListener(
            self.loop, self.host, self._on_destination, self._on_decode_abort
        )
        self.bootstrap_server = BootstrapServer(self.host, bootstrap_port, loop=self.loop)
        self.bootstrap_port = self.bootstrap_server.port
        local = self.host not in _WILDCARD_HOSTS
        rank_ip = os.environ.get("SGLANG_HOST_IP") or (
            self.host if local else socket.gethostbyname(socket.gethostname())
        )
        entry = {
            "role": "Prefill",
            "rank_ip": rank_ip,
            "rank_port": self.control.port,
            "attn_tp_size": 1,
            "attn_tp_rank": 0,
            "attn_dp_size": 1,
            "attn_dp_rank": 0,
            "pp_size": 1,
            "pp_rank": 0,
            "agent_name": self.backend.name,
            "page_size": self.page_size,
        }
        own = f"{self.host if local else '127.0.0.1'}:{self.bootstrap_port}"
        self.loop.run(put_route(self.session, own, entry), timeout=10)

    def close(self) -> None:
        """Fail every live sender/receiver, stop the threads and servers; idempotent."""
        with self.lock:
            if self._closed:
                return
            self._closed = True
            for peer in [*self.senders.values(), *self.receivers.values()]:
                peer._fail(f"room {peer.room}: KV manager closed")
        if self.xfer is not None:
            self.xfer.close()
        if self.notif_poller is not None:
            self.notif_poller.close()
        for server in (self.control, self.bootstrap_server):
            if server is not None:
                server.close()
        self.loop.run(self.session.close(), timeout=5)
        self.loop.stop()
        self.backend.close()

    # --- prefill room table. Methods named _attach/_on_* take self.lock; the rest need it held. --
    def _attach_sender(self, sender: KVSender) -> None:
        with self.lock:
            self._check_open()
            room = sender.room
            if room in self.senders:
                raise RoomInUseError(f"room {room} already has a live KVSender on this worker")
            self._expire(time.monotonic())
            self.senders[room] = sender
            if room in self._tombstones:
                sender._fail(f"decode aborted room {room} before prefill took it")
            elif room in self._pending:
                sender._on_destination(self._pending.pop(room)[0])

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"this {self.mode} KVManager is closed")

    def _detach_sender(self, sender: KVSender) -> None:
        if self.senders.get(sender.room) is sender:
            del self.senders[sender.room]

    def _tombstone(self, room: int) -> None:
        self._tombstones[room] = time.monotonic() + 2 * self.bootstrap_timeout
        self._pending.pop(room, None)

    def _expire(self, now: float) -> None:
        self._pending = {r: v for r, v in self._pending.items() if v[1] > now}
        self._tombstones = {r: t for r, t in self._tombstones.items() if t > now}

    def _on_destination(self, dest: Destination) -> str | None:
        """Loop thread: decode's destination for a room; returns why it is refused, or None."""
        try:
            self.backend.add_peer(dest.agent_name, dest.agent_metadata)
        except Exception as e:  # noqa: BLE001 -- nixl raises its own types; answer 409, not 500
            return f"room {dest.room}: bad NIXL agent metadata from decode: {e}"
        with self.lock:
            self._expire(time.monotonic())
            if dest.room in self._tombstones:
                return f"room {dest.room} was aborted on prefill"
            sender = self.senders.get(dest.room)
            if dest.room in self._pending or (sender is not None and sender._dest is not None):
                return f"room {dest.room} already has a destination"
            if sender is None:
                self._pending[dest.room] = (dest, time.monotonic() + self.bootstrap_timeout)
            else:
                sender._on_destination(dest)
        return None

    def _on_decode_abort(self, room: int) -> threading.Event | None:
        """Loop thread: decode gave the room up. Returns what to wait for before acknowledging:
        the release of a WRITE already handed to the transfer thread (None: nothing in flight)."""
        with self.lock:
            self._tombstone(room)
            sender = self.senders.get(room)
            if sender is None:
                return None
            sender._dest = None  # decode knows already; do not notify it back
            job = sender._job
            sender._fail(f"decode aborted room {room}")
            return job.released if job is not None else None

    # --- decode ----------------------------------------------------------------------------------
    def _attach_receiver(self, receiver: KVReceiver) -> None:
        with self.lock:
            self._check_open()
            if receiver.room in self.receivers:
                raise RoomInUseError(f"room {receiver.room} already has a live KVReceiver here")
            self.receivers[receiver.room] = receiver

    def _detach_receiver(self, receiver: KVReceiver) -> None:
        if self.receivers.get(receiver.room) is receiver:
            del self.receivers[receiver.room]

    def _poll_notifs(self) -> bool:
        """Poller thread: drain once if a receiver awaits its KV; True while one still does."""
        with self.lock:
            if self._closed or not self._awaiting_kv():
                return False
            self._drain_notifs()
            return self._awaiting_kv()

    def _awaiting_kv(self) -> bool:
        # A receiver stays in the table until it is done; init() gave it a destination.
        return any(r.initialized for r in self.receivers.values())

    def _drain_notifs(self) -> None:
        """Hand each notification that arrived to the receiver of its room (lock held)."""
        for raw in self.backend.get_notifs():
            try:
                msg = json.loads(raw)
                room = int(msg[BOOTSTRAP_ROOM])
            except (ValueError, KeyError, TypeError):
                logger.warning("dropped a malformed KV notification: %r", raw[:200])
                continue
            receiver = self.receivers.get(room)
            if receiver is None:
                logger.info("dropped the notification of room %d: no live receiver", room)
            else:
                receiver._on_notif(msg)

    async def _control_url(self, bootstrap_addr: str) -> str:
        """Loop thread: the control URL of the prefill rank behind a bootstrap server, cached."""
        if bootstrap_addr not in self._routes:
            route = await get_route(self.session, bootstrap_addr)
            self._routes[bootstrap_addr] = f"http://{route['rank_ip']}:{route['rank_port']}"
        return self._routes[bootstrap_addr]

    def _forget_route(self, bootstrap_addr: str) -> None:
        self._routes.pop(bootstrap_addr, None)
