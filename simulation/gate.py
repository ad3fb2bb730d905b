"""The router's warm-up admission, as router/prefill_gate.py and router/compute_device.py do it:
a warm-up enters a prefill worker only while no critical prefill is outstanding there, at most
`max_warmups_in_flight` at a time, and (device scope) only if its worker then fits in the
device's slots beside every busy worker (a worker with open decode streams, a critical hold or a
warm-up in flight). Warm-ups ready to go queue at the gate by a key (the router's: its question's
rank, then the order successors started); when it opens the smallest goes first."""

from __future__ import annotations

import simpy

from simulation.signal import Signal


class DeviceGate:
    """The router's view of one shared device: which workers are busy."""

    def __init__(self, env: simpy.Environment, slots: int, scope: str = "device") -> None:
        self.env, self.slots, self.scope = env, slots, scope
        self.streams: dict[str, int] = {}  # decode worker -> open decode streams
        self.gates: list[PrefillGate] = []
        self.changed = Signal(env)

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
        self.changed.fire()


class PrefillGate:
    def __init__(self, worker: str, device: DeviceGate, max_warmups_in_flight: int = 1) -> None:
        self.worker, self.device, self.max_warmups = worker, device, max_warmups_in_flight
        self.critical = 0
        self.warmups = 0
        self._queued: set[tuple[int, int]] = set()
        device.gates.append(self)

    def try_enter(self, key: tuple[int, int]) -> bool:
        if self.critical or self.warmups >= self.max_warmups:
            return False
        if not self.device.admits(self.worker):
            return False
        if self._queued and min(self._queued) < key:
            return False
        self._queued.discard(key)
        self.warmups += 1
        self.device.notify()
        return True

    def queue(self, key: tuple[int, int]) -> None:
        self._queued.add(key)

    def unqueue(self, key: tuple[int, int]) -> None:
        if key in self._queued:
            self._queued.discard(key)
            self.device.notify()

    def leave(self) -> None:
        self.warmups -= 1
        self.device.notify()

    def hold(self) -> None:
        self.critical += 1
        self.device.notify()

    def release(self) -> None:
        self.critical -= 1
        self.device.notify()
