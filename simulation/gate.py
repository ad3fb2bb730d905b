"""The router's warm-up admission, as router/prefill_gate.py and router/compute_device.py do it:
a warm-up enters a prefill worker only while no critical prefill is outstanding there, at most
`max_warmups_in_flight` at a time, and (device scope) only if its worker then fits in the
device's slots beside every busy worker (a worker with open decode streams, a critical hold or a
warm-up in flight) and pays for the decodes it slows. Warm-ups ready to go queue at the gate by a
key (the router's: its question's rank, then the order successors started), each with its
benefit (its successor's chance of being on the critical path); when the gate opens, the
smallest key it would admit goes first, and only that one is woken (the others would only find
it taken).

The slowdown is measured as the router measures it: the same DecodeSlowdown on the simulated
clock, fed each simulated decode step of the open streams as their chunks, the warm-ups' spans and
the same disturbances (the open streams per decode worker, the critical holds), and weighed by
the same rule (router/compute_device.warmup_pays). What it reads is the device model's co-run
slowdown (simulation/device.py), not the real machine's, so the simulated gate refuses under
load where that model says a warm-up costs more than it saves."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from statistics import NormalDist

import simpy

from router.compute_device import warmup_pays
from router.decode_slowdown import DecodeSlowdown
from simulation.signal import Signal


class DeviceGate:
    """The router's view of one shared device: which workers are busy, and how much a warm-up
    slows the decodes beside it."""

    def __init__(
        self,
        env: simpy.Environment,
        slots: int,
        scope: str = "device",
        weigh_slowdown: bool = True,
        confidence: float = 0.5,
    ) -> None:
        """`weigh_slowdown`, `confidence`: cluster.json's warmup_weigh_slowdown and
        warmup_slowdown_confidence (the router's defaults: True, 0.5)."""
        self.env, self.slots, self.scope = env, slots, scope
        self.weigh_slowdown = weigh_slowdown
        self.z = NormalDist().inv_cdf(confidence)
        self.slowdown = DecodeSlowdown(clock=lambda: env.now)
        self.streams: dict[str, int] = {}  # decode worker -> open decode streams
        self.questions: Counter[Hashable] = Counter()  # question -> its open decode streams
        self.gates: list[PrefillGate] = []
        self._state: tuple | None = None  # what the slowdown's segments must not see change

    def busy(self) -> set[str]:
        out = {w for w, n in self.streams.items() if n > 0}
        out.update(g.worker for g in self.gates if g.critical or g.warmups)
        return out

    def admits(self, worker: str, benefit: float = 1.0) -> bool:
        if self.scope != "device":
            return True
        if len(self.busy() | {worker}) > self.slots:
            return False
        if not self.weigh_slowdown:
            return True
        if warmup_pays(self.slowdown.shifted(self.z), len(self.questions), benefit):
            return True
        self.slowdown.refused()  # as the router: a reading that refuses for long is re-measured
        return False

    def decode_started(self, worker: str, question: Hashable = None) -> None:
        """A decode stream of `question` opened on `worker` (as the router counts it: from the
        request on, its prefill included)."""
        self.streams[worker] = self.streams.get(worker, 0) + 1
        self.questions[question] += 1
        self.notify()

    def decode_ended(self, worker: str, question: Hashable = None) -> None:
        self.streams[worker] -= 1
        self.questions[question] -= 1
        if self.questions[question] <= 0:
            del self.questions[question]
        self.notify()

    def decode_step(self, since: float, streams: int) -> None:
        """A decode step of a worker on this device ended: a chunk for each of `streams` open
        streams whose previous one came at `since` (simulation/workers.DecodeWorker.on_step)."""
        self.slowdown.steps(since, streams)

    def notify(self) -> None:
        state = (
            frozenset((w, n) for w, n in self.streams.items() if n > 0),
            tuple(g.critical for g in self.gates),
        )
        if state != self._state:
            self._state = state
            self.slowdown.disturbed()
        for g in self.gates:
            g.call_next()


class PrefillGate:
    def __init__(self, worker: str, device: DeviceGate, max_warmups_in_flight: int = 1) -> None:
        self.worker, self.device, self.max_warmups = worker, device, max_warmups_in_flight
        self.critical = 0
        self.warmups = 0
        self._queued: dict[tuple[int, int], tuple[Signal, float]] = {}  # key -> turn, benefit
        device.gates.append(self)

    def is_open(self, benefit: float = 1.0) -> bool:
        return (
            not self.critical
            and self.warmups < self.max_warmups
            and self.device.admits(self.worker, benefit)
        )

    def try_enter(self, key: tuple[int, int], benefit: float = 1.0) -> bool:
        """As the router's: refused while a queued warm-up before `key` would be admitted (one
        the gate refuses for its benefit holds no one back)."""
        if not self.is_open(benefit) or any(
            k < key and self.is_open(b) for k, (_, b) in self._queued.items() if k != key
        ):
            return False
        self._queued.pop(key, None)
        self.warmups += 1
        self.device.slowdown.warmup_started()
        self.device.notify()
        return True

    def queue(self, key: tuple[int, int], benefit: float = 1.0) -> simpy.Event:
        """Wait in the queue with `key`: the event fires when it may be this one's turn."""
        if key not in self._queued:
            self._queued[key] = (Signal(self.device.env), benefit)
        return self._queued[key][0].wait()

    def unqueue(self, key: tuple[int, int]) -> None:
        if self._queued.pop(key, None) is not None:
            self.device.notify()

    def call_next(self) -> None:
        """Wake the first of the queue that could enter now."""
        for key in sorted(self._queued):
            turn, benefit = self._queued[key]
            if self.is_open(benefit):
                turn.fire()
                return

    def leave(self) -> None:
        self.warmups -= 1
        self.device.slowdown.warmup_ended()
        self.device.notify()

    def hold(self) -> None:
        self.critical += 1
        self.device.notify()

    def release(self) -> None:
        self.critical -= 1
        self.device.notify()
