"""NixlBackend: the KV transport over NIXL (UCX), DRAM to DRAM. The only module importing nixl.

Created by KVManager(backend="nixl"); every call is serialised by one lock because the agent is
built without NIXL's own thread sync (it is called from the scheduler and the manager threads).
The agent runs without NIXL's progress thread: our own threads drive UCX only while transfers
are pending (see __init__).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import threading

import numpy as np
import torch

from sglang_ext.disagg.ranges import Range
from sglang_ext.disagg.transfer import TransferBackend, XferState

logger = logging.getLogger(__name__)

_DEV_ID = 0  # DRAM descriptors carry a device id; 0 for host memory


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _set_ucx_defaults(host: str) -> None:
    """Environment UCX reads when the backend is created; values already set always win.

    UCX_NET_DEVICES=lo only for a worker bound to loopback: its peers are on this host, and
    letting UCX advertise every interface makes it try addresses that a sandboxed or
    multi-homed host cannot route. UCX_TLS is left to UCX: on one host it picks shared memory,
    ~3x faster than `tcp` for a 47 MB KV here, and it falls back to TCP between hosts.
    """
    if _is_loopback(host):
        os.environ.setdefault("UCX_NET_DEVICES", "lo")


def _descs(ranges: list[Range]) -> np.ndarray:
    arr = np.empty((len(ranges), 3), dtype=np.uint64)
    arr[:, :2] = np.asarray(ranges, dtype=np.uint64).reshape(-1, 2)
    arr[:, 2] = _DEV_ID
    return arr


class NixlBackend(TransferBackend):
    def __init__(self, name: str, kv_buffer: torch.Tensor, *, host: str) -> None:
        _set_ucx_defaults(host)
        from nixl._api import nixl_agent, nixl_agent_config

        plugin = os.environ.get("SGLANG_DISAGGREGATION_NIXL_BACKEND", "UCX")
        params = json.loads(os.environ.get("SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS", "{}"))
        self.name = name
        self._lock = threading.Lock()
        # No NIXL progress thread: it spins on UCX at ~half a core per worker even when idle
        # (measured 48% vs 0%), which halves throughput with two workers per model on a 2-core
        # host. UCX progresses inside our calls instead, and only while something is pending:
        # prefill's TransferWorker calls check_xfer_state (initiator side) and decode's
        # KVManager notification poller calls get_new_notifs (target side, which also delivers
        # the notification that ends each transfer).
        self._agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=False, backends=[]))
        if plugin not in self._agent.get_plugin_list():
            raise RuntimeError(
                f"NIXL plugin {plugin!r} is not available (have {self._agent.get_plugin_list()}); "
                "set SGLANG_DISAGGREGATION_NIXL_BACKEND to one of them"
            )
        self._agent.create_backend(plugin, {str(k): str(v) for k, v in params.items()})
        self._kv_buffer = kv_buffer  # keep the registered memory alive as long as the agent
        nbytes = kv_buffer.numel() * kv_buffer.element_size()
        self._reg = self._agent.register_memory(
            [(kv_buffer.data_ptr(), nbytes, _DEV_ID, "")], "DRAM"
        )
        self._peers: set[str] = set()
        self._stash: list[bytes] = []  # notifications received while progressing a send_notif

    def metadata(self) -> bytes:
        with self._lock:
            return self._agent.get_agent_metadata()

    def add_peer(self, name: str, metadata: bytes) -> None:
        with self._lock:
            if name in self._peers:
                return
            got = self._agent.add_remote_agent(metadata)
            got = got.decode() if isinstance(got, bytes) else got
            if got != name:
                raise ValueError(f"agent metadata names {got!r}, the message says {name!r}")
            self._peers.add(name)

    def write(self, src: list[Range], dst: list[Range], peer: str, notif: bytes) -> object:
        local, remote = _descs(src), _descs(dst)
        with self._lock:
            handle = self._agent.initialize_xfer(
                "WRITE",
                self._agent.get_xfer_descs(local, "DRAM"),
                self._agent.get_xfer_descs(remote, "DRAM"),
                peer,
                notif,
            )
            state = self._agent.transfer(handle)
        if state == "ERR":
            self.release(handle)
            raise RuntimeError(f"NIXL WRITE to agent {peer!r} failed to start")
        return handle

    def check(self, handle: object) -> XferState:
        with self._lock:
            return XferState(self._agent.check_xfer_state(handle))

    def release(self, handle: object) -> None:
        try:
            with self._lock:
                self._agent.release_xfer_handle(handle)
        except Exception as e:  # noqa: BLE001 -- nixl's own error types; a stuck handle only leaks
            logger.warning("could not release NIXL transfer handle: %s", e)

    def send_notif(self, peer: str, msg: bytes) -> None:
        with self._lock:
            self._agent.send_notif(peer, msg)
            # Without a progress thread a posted message may wait for the next UCX progress;
            # progress once now (it can only collect notifications: keep them for get_notifs).
            self._stash.extend(self._drain())

    def get_notifs(self) -> list[bytes]:
        with self._lock:
            out, self._stash = self._stash + self._drain(), []
        return out

    def _drain(self) -> list[bytes]:
        return [m for msgs in self._agent.get_new_notifs().values() for m in msgs]

    def close(self) -> None:
        with self._lock:
            for peer in self._peers:
                self._agent.remove_remote_agent(peer)
            self._peers.clear()
            self._agent.deregister_memory(self._reg)
