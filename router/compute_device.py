"""A compute device that several workers share (one GPU, or the CPU cores of an unpinned
deployment), so a warm-up is admitted only where it takes no compute from critical work.

Why: the per-worker PrefillGate keeps warm-ups off a prefill worker while a critical prefill is
outstanding *there*, but when prefill and decode workers share a device, a warm-up also takes
compute from the decodes running beside it. Measured on `tree_9_3_1_mixed_cpu` (four workers on
two cores): pipelining hid 2.8 s of exposed prefill and lost 2.7 s to slower decoding. A device
has `slots` units of compute (its cores on a CPU; one on a GPU, where kernels of different
processes time-slice); a worker is busy while it decodes a stream, holds a critical prefill or
runs a warm-up, and a warm-up is admitted only if its worker then fits in the slots with every
other busy worker. Owned by RouterContext, shared by every model's Deployment on the device.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.prefill_gate import PrefillGate


class ComputeDevice:
    def __init__(self, name: str, slots: int) -> None:
        self.name, self.slots = name, slots
        self._prefill_gates: dict[str, PrefillGate] = {}  # by prefill worker URL
        self._decoding: Counter[str] = Counter()  # open decode streams by decode worker URL

    def attach(self, url: str, gate: PrefillGate) -> None:
        """Count the prefill worker at `url` (its gate's holds and warm-ups) on this device."""
        self._prefill_gates[url] = gate
        gate.device, gate.url = self, url

    def busy_workers(self) -> set[str]:
        busy = {url for url, n in self._decoding.items() if n > 0}
        busy.update(
            url for url, g in self._prefill_gates.items() if g.critical or g.warmups_in_flight
        )
        return busy

    def admits_warmup(self, url: str) -> bool:
        """Whether the prefill worker at `url` may start a warm-up without taking a slot from
        another busy worker."""
        return len(self.busy_workers() | {url}) <= self.slots

    def decode_started(self, url: str) -> None:
        self._decoding[url] += 1
        self.notify()

    def decode_ended(self, url: str) -> None:
        self._decoding[url] -= 1
        if self._decoding[url] <= 0:
            del self._decoding[url]
        self.notify()

    def notify(self) -> None:
        """Wake every gate's waiters: one worker's change can open another worker's gate."""
        for gate in list(self._prefill_gates.values()):
            gate.wake()
