"""`PDTransfer`: a PD request's KV transfer endpoint, as SGLang names them (KVSender on prefill,
KVReceiver on decode): make it, send or receive pages, read the aux data, abort it.

Holds no request state: the scheduler (engine thread) decides when a request moves, and calls
this for what travels. Timeouts live in the KVSender/KVReceiver (their KVManager has the engine's
bootstrap and waiting timeouts); tests swap `make_sender`/`make_receiver` for doubles.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sglang_ext import protocol as P
from sglang_ext.disagg import FakeKVSender, KVReceiver, KVSender, page_ranges
from sglang_ext.engine.config import EngineConfig
from sglang_ext.engine.request import Req

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class FirstToken:
    """What decode takes over from prefill's aux data."""

    token: int
    logprob: float | None
    top_logprobs: list
    cached_tokens: int


class PDTransfer:
    def __init__(self, cfg: EngineConfig, kv_manager, kv_buffer) -> None:
        self.cfg, self.mgr, self.kv_buffer = cfg, kv_manager, kv_buffer
        self.make_sender: Callable[[Req], Any] = self._new_sender
        self.make_receiver: Callable[[Req], Any] = self._new_receiver

    def _new_sender(self, req: Req):
        # SGLang: the sender's address is the request's host with our own bootstrap port.
        addr = f"{req.bootstrap_host}:{self.cfg.bootstrap_port}"
        cls = FakeKVSender if req.bootstrap_host == P.FAKE_BOOTSTRAP_HOST else KVSender
        return cls(self.mgr, addr, req.bootstrap_room)

    def _new_receiver(self, req: Req):
        port = req.bootstrap_port or self.cfg.bootstrap_port
        return KVReceiver(self.mgr, f"{req.bootstrap_host}:{port}", req.bootstrap_room)

    def open(self, req: Req) -> None:
        """Attach the request's endpoint (exceptions: the caller fails the request)."""
        if self.cfg.mode == "prefill":
            req.kv_sender = self.make_sender(req)
        else:
            req.kv_receiver = self.make_receiver(req)

    def ranges(self, pages: list[int]):
        return page_ranges(self.kv_buffer, pages, self.cfg.page_size)

    def send(self, req: Req, pages: list[int]) -> None:
        """Prefill done: ship the prompt's pages and the first token to decode."""
        aux = {
            P.AUX_FIRST_TOKEN: req.output_ids[-1],
            P.CACHED_TOKENS: req.cached_tokens,
            P.PROMPT_TOKENS: req.prompt_len,
            P.AUX_LOGPROB: req.output_logprobs[-1] if req.output_logprobs else None,
            P.AUX_TOP_LOGPROBS: [list(t) for t in req.output_top_logprobs[-1]]
            if req.output_top_logprobs
            else [],
        }
        req.kv_sender.send(self.ranges(pages), aux)

    def first_token(self, req: Req) -> FirstToken:
        """Decode: what prefill sent with the KV (KeyError/ValueError for unusable aux)."""
        aux = req.kv_receiver.aux() or {}
        return FirstToken(
            int(aux[P.AUX_FIRST_TOKEN]),
            aux.get(P.AUX_LOGPROB),
            [tuple(x) for x in aux.get(P.AUX_TOP_LOGPROBS) or []],
            int(aux.get(P.CACHED_TOKENS, 0)),
        )

    @staticmethod
    def failure(peer, what: str, hint: str = "") -> tuple[int, str]:
        """(HTTP status, message) of a failed endpoint: 504 when it timed out."""
        reason = getattr(peer, "failure_reason", None)
        msg = f"{what}: {reason}" if reason else what
        status = 504 if getattr(peer, "timed_out", False) else 502
        return status, f"{msg}; {hint}" if hint else msg

    @staticmethod
    def close(req: Req):
        """Abort the request's endpoint; returns the receiver when prefill may still WRITE into
        the request's pages (they must wait in quarantine), else None."""
        receiver = req.kv_receiver
        for peer in (req.kv_sender, receiver):
            if peer is not None:
                try:
                    peer.abort()
                except Exception:
                    logger.exception("abort of %s failed", req.rid)
        req.kv_sender = req.kv_receiver = None
        return receiver if receiver is not None and writes_possible(receiver) else None


def writes_possible(receiver) -> bool:
    try:
        return bool(getattr(receiver, "writes_possible", False))
    except Exception:  # noqa: BLE001 - an endpoint that cannot tell: be safe until the deadline
        return True
