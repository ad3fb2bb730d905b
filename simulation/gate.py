"""The router's warm-up admission, as router/prefill_gate.py and router/compute_device.py do it:
a warm-up enters a prefill worker only while no critical prefill is outstanding there, at most
`max_warmups_in_flight` at a time, and (device scope) only if its worker then fits in the
device's slots beside every busy worker (a worker with open decode streams, a critical hold or a
warm-up in flight). Warm-ups ready to go queue at the gate by a key (the router's: its question's
rank, then the order successors started); when it opens the smallest goes first, and only that
one is woken (the others would only find it taken)."""

from __future__ import annotations

import simpy

from simulation.signal import Signal


class DeviceGate:
    """The router's view of one shared device: which workers are busy."""

    def __init__(self, env: simpy.Environment, slots: int, scope: str = "device") -> None:
        self.env, self.slots, self.scope = env, slots, scope
        self.streams: dict[str, int] = {}  # decode worker -> open decode streams
        self.gates: list[PrefillGate] = []

    def busy(self) -> set[str]:
        out = {w for w, n in self.streams.items() if n > 0}
        out.update(g.worker for g in self.gates if g.critical or g.warmups)
        return out

    def admits(self, worker: str) -> bool:
        return self.scope != "device" or len(self.busy() | {worker}) <= self.slots

    def decode_started(self, worker: str) -> None:
        self.streams[worker] = self.streams.get(worker, 0) + 1
        self.notify()

    def decode_ended(self, worker: str) -> None:
        self.streams[worker] -= 1
        self.notify()

    def notify(self) -> None:
        for g in self.gates:
            g.call_next()


class PrefillGate:
    def __init__(self, worker: str, device: DeviceGate, max_warmups_in_flight: int = 1) -> None:
        self.worker, self.device, self.max_warmups = worker, device, max_warmups_in_flight
        self.critical = 0
        self.warmups = 0
        self._queued: dict[tuple[int, int], Signal] = {}  # key -> its turn
        device.gates.append(self)

    def is_open(self) -> bool:
        return (
            not self.critical
            and self.warmups < self.max_warmups
            and self.device.admits(self.worker)
        )

    def try_enter(self, key: tuple[int, int]) -> bool:
        if not self.is_open() or (self._queued and min(self._queued) < key):
            return False
        self._queued.pop(key, None)
        self.warmups += 1
        self.device.notify()
        return True

    def queue(self, key: tuple[int, int]) -> simpy.Event:
        """Wait in the queue with `key`: the event fires when it may be this one's turn."""
        turn = self._queued.setdefault(key, Signal(self.device.env))
        return turn.wait()

    def unqueue(self, key: tuple[int, int]) -> None:
        if self._queued.pop(key, None) is not None:
            self.device.notify()

    def call_next(self) -> None:
        """Wake the first of the queue if it could enter now."""
        if self._queued and self.is_open():
            self._queued[min(self._queued)].fire()

    def leave(self) -> None:
        self.warmups -= 1
        self.device.notify()

    def hold(self) -> None:
        self.critical += 1
        self.device.notify()

    def release(self) -> None:
        self.critical -= 1
        self.device.notify()
