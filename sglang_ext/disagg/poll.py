"""KVPoll: the transfer states every KV sender and receiver reports, numbered as SGLang numbers them.

Read by the engine's prefill and decode queues on each scheduler step.
"""

from __future__ import annotations

import enum


class KVPoll(enum.IntEnum):
    Failed = 0
    Bootstrapping = 1  # the peer's side of the handshake has not arrived yet
    WaitingForInput = 2  # handshake done: prefill may compute and send(); decode waits for the data
    Transferring = 3
    Success = 4

    @property
    def is_done(self) -> bool:
        return self in (KVPoll.Failed, KVPoll.Success)
