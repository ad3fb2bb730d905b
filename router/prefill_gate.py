"""Admission of warm-ups to one prefill worker: second-class work that must never delay a
critical prefill (a leaf's prompt, a successor's final request) on the same worker.

Why in the router and not only in the worker: SGLang's priority scheduling is a tie-breaker on a
`--disaggregation-mode prefill` server (no preemption, a started chunked prefill always goes on,
fake-bootstrap warm-ups can overtake real requests in the bootstrap queue), and a queued warm-up
costs the critical request a whole forward. So the router holds warm-ups back while any critical
prefill is outstanding on the worker, and lets at most `max_warmups_in_flight` through at a time;
worker-side priority (the `priority` field) stays as a second line.

A critical hold lasts from sending the request until its prefill is known to be over (the prefill
worker's reply, or the first token). One gate per prefill worker, shared by every session of a
router process (owned by `Deployment`). Where the worker shares a device with other workers
(router/compute_device.py), the gate also waits for a free slot on that device. Warm-ups that
are ready and wait for the gate queue by a key (rank, arrival): when it opens, the smallest goes
first (router/priority.py ranks them).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.compute_device import ComputeDevice


class CriticalHold:
    """One outstanding critical prefill; `release` is idempotent (first token or reply)."""

    __slots__ = ("_gates",)

    def __init__(self, gates: list[PrefillGate]) -> None:
        self._gates = gates
        for g in gates:
            g._critical += 1
            g._changed()

    def release(self) -> None:
        gates, self._gates = self._gates, []
        for g in gates:
            g._critical -= 1
            g._changed()


class PrefillGate:
    def __init__(self, max_warmups_in_flight: int = 1, enforce_critical: bool = True) -> None:
        self.max_warmups_in_flight = max_warmups_in_flight
        # False only to measure what the gate buys: critical holds are counted, never waited for.
        self.enforce_critical = enforce_critical
        self._critical = 0
        self._warmups = 0
        self._waiters: list[asyncio.Future] = []
        # Keys of the warm-ups ready to go that wait for the gate, with their benefit; the
        # smallest key the gate would admit enters first.
        self._queued: dict[tuple[int, int], float] = {}
        # Set by ComputeDevice.attach when the worker shares a device with others.
        self.device: ComputeDevice | None = None
        self.url = ""

    @property
    def critical(self) -> int:
        return self._critical

    @property
    def warmups_in_flight(self) -> int:
        return self._warmups

    def is_open(self, benefit: float = 1.0) -> bool:
        """Whether a warm-up may start now; `benefit`: its successor's chance of being on its
        question's critical path, which a shared device weighs against the decodes it slows."""
        if not self.enforce_critical:
            return self._warmups < self.max_warmups_in_flight
        return (
            self._critical == 0
            and self._warmups < self.max_warmups_in_flight
            and (self.device is None or self.device.admits_warmup(self.url, benefit))
        )

    def try_enter(self, key: tuple[int, int] | None = None, benefit: float = 1.0) -> bool:
        """Take a warm-up slot if the gate is open and no queued warm-up goes before `key`
        (None: whatever is queued); pair with `leave`."""
        if not self.is_open(benefit):
            return False
        if key is not None and any(
            k < key and self.is_open(b) for k, b in self._queued.items() if k != key
        ):
            return False
        self._queued.pop(key, None)
        self._warmups += 1
        if self.device is not None:
            self.device.warmup_started()
        if self._queued:
            self._changed()  # the next in the queue may fit too (more than one slot)
        return True

    def queue(self, key: tuple[int, int], benefit: float = 1.0) -> None:
        """A warm-up ready to go waits for the gate with `key`; `unqueue` when it no longer does.
        One the gate would not admit for its `benefit` does not hold back those behind it."""
        self._queued[key] = benefit

    def unqueue(self, key: tuple[int, int]) -> None:
        if self._queued.pop(key, None) is not None:
            self._changed()  # the warm-ups behind it may go now

    def leave(self) -> None:
        self._warmups -= 1
        if self.device is not None:
            self.device.warmup_ended()
        self._changed()

    async def wait_change(self) -> None:
        """Return at the next change of the gate's state (a hold or a slot taken or freed)."""
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        await fut

    @contextlib.asynccontextmanager
    async def warmup(self) -> AsyncIterator[None]:
        """Wait for the gate to open, then hold a warm-up slot for the body."""
        while not self.try_enter():
            await self.wait_change()
        try:
            yield
        finally:
            self.leave()

    def _changed(self) -> None:
        if self.device is not None:
            self.device.notify()  # wakes this gate too
        else:
            self.wake()

    def wake(self) -> None:
        """Resolve the waiters of `wait_change`."""
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)


def hold(gates: list[PrefillGate]) -> CriticalHold:
    """Mark a critical prefill outstanding on `gates` until the hold is released."""
    return CriticalHold(gates)
