"""TransferWorker: the prefill thread that posts each KV WRITE and drives it to completion.

NIXL completes a WRITE (and sends its notification to decode) only when the initiator checks
it, so the check cannot wait for the scheduler's next poll: this thread checks every in-flight
transfer about every half millisecond. Owned by the prefill KVManager; jobs come from KVSender.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from sglang_ext.disagg.ranges import Range, match_ranges
from sglang_ext.disagg.transfer import TransferBackend, XferState

logger = logging.getLogger(__name__)

_CHECK_INTERVAL_S = 0.0005


@dataclass(eq=False)
class XferJob:
    src: list[Range]
    dst: list[Range]
    peer: str
    notif: bytes
    on_done: Callable[[str | None], None]  # None when the data and notification are delivered
    cancelled: bool = False  # set by the sender on abort/timeout; the worker releases the handle
    handle: object | None = None
    # Set once the worker is done with the job (handle released, or never posted): no byte of
    # it can land at decode after that. Decode's abort is acknowledged only then.
    released: threading.Event = field(default_factory=threading.Event)


class TransferWorker:
    def __init__(self, backend: TransferBackend, name: str) -> None:
        self._backend = backend
        self._queue: queue.SimpleQueue[XferJob | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: XferJob) -> None:
        self._queue.put(job)

    def close(self, timeout: float = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        inflight: list[XferJob] = []
        while True:
            try:
                job = self._queue.get(timeout=_CHECK_INTERVAL_S if inflight else None)
            except queue.Empty:
                job = ...
            if job is None:
                for j in inflight:
                    self._backend.release(j.handle)
                    j.released.set()
                return
            if isinstance(job, XferJob) and self._post(job):
                inflight.append(job)
            inflight = [j for j in inflight if not self._finished(j)]

    def _post(self, job: XferJob) -> bool:
        if job.cancelled:
            job.released.set()
            return False
        try:
            src, dst = match_ranges(job.src, job.dst)
            job.handle = self._backend.write(src, dst, job.peer, job.notif)
        except Exception as e:  # noqa: BLE001 -- any failure must reach the sender, not kill us
            job.released.set()
            job.on_done(str(e))
            return False
        return True

    def _finished(self, job: XferJob) -> bool:
        if job.cancelled:
            self._backend.release(job.handle)
            job.released.set()
            return True
        state = self._backend.check(job.handle)
        if state == XferState.PROC:
            return False
        self._backend.release(job.handle)
        job.released.set()
        job.on_done(None if state == XferState.DONE else f"NIXL WRITE to agent {job.peer} failed")
        return True
