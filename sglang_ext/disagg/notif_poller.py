"""NotifPoller: the decode thread that keeps UCX progressing while KV transfers are pending.

NIXL runs without its own progress thread (see nixl_transfer.py), so the target side of a WRITE
progresses only when decode asks for notifications. The engine asks once per scheduler step,
which can be seconds apart during a long forward; this thread asks every millisecond while any
receiver waits for its KV, and sleeps (no CPU) when none does. Owned by the decode KVManager.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.001


class NotifPoller:
    def __init__(
        self, poll: Callable[[], bool], name: str, interval_s: float = POLL_INTERVAL_S
    ) -> None:
        """`poll()` drains notifications once and returns whether anything is still pending."""
        self._poll = poll
        self._interval_s = interval_s
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Something became pending: start polling now."""
        self._wake.set()

    def close(self, timeout: float = 5.0) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        pending = False
        while True:
            self._wake.wait(self._interval_s if pending else None)
            # Clear before polling: a wake() that races with this poll is seen by the next one.
            self._wake.clear()
            if self._stop:
                return
            try:
                pending = self._poll()
            except Exception:  # keep polling: each receiver still times out on its own
                logger.exception("KV notification poll failed")
                pending = True
