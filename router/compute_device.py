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

Counting slots cannot see what a warm-up costs the decodes beside it when it fits (issue 28:
on `tree_9_3_1_cpu`, one PD pair on two cores, every warm-up fits, and #3 decoded 20.5 s longer
than #2 over 20 questions). So the device also measures how much warm-ups slow the decode
steps beside it (router/decode_slowdown.py; on that CPU ~0.01, docs/benchmarks.md), and a
warm-up whose successor has chance `benefit` of being on its question's critical path (1 for a
question's only successor in its layer, 1/3 for one of three aggregators) is admitted only if
slowdown × (the questions decoding on the device) ≤ benefit: its time saved on the critical path
against the time it adds to every question whose critical path decodes beside it. That charges
the other questions in full, which errs toward not warming: under load a warm-up's prefill is
work moved earlier rather than added, but its overhead, and the critical prefills that queue
behind it, are added, and the router cannot see how much of each. Not warming costs at most
what blocking costs. Until the slowdown is measured, warm-ups are admitted by slots alone.

`confidence` is how sure the meter must be that a warm-up does not pay before the gate refuses
it: the gate weighs the slowdown's one-sided bound at that level, below the estimate above 0.5
(refuse only when sure: fewer flips where a reading sits near its break-even, as at concurrency
4 in stop 44, 0.087-0.099 against 1/3 ÷ 4 = 0.083) and above it below 0.5 (admit only when
sure it pays). 0.5, the estimate itself, is the default: neither bound measured better
(docs/benchmarks.md, stop 45).
"""

from __future__ import annotations

from collections import Counter
from statistics import NormalDist
from typing import TYPE_CHECKING

from router.decode_slowdown import DecodeSlowdown

if TYPE_CHECKING:
    from router.prefill_gate import PrefillGate


def warmup_pays(slowdown: float | None, questions_decoding: int, benefit: float) -> bool:
    """The weighing above, shared with the simulator's gate (simulation/gate.py): a warm-up
    pays if the slowdown it adds to each question decoding on the device, summed over them, is
    at most its `benefit`; while the slowdown is unmeasured (None), it is admitted."""
    if slowdown is None or questions_decoding == 0:
        return True
    return slowdown * questions_decoding <= benefit


class ComputeDevice:
    def __init__(
        self, name: str, slots: int, weigh_slowdown: bool = True, confidence: float = 0.5
    ) -> None:
        """`weigh_slowdown`: False admits warm-ups by slots alone (the gate before issue 28;
        benchmarks compare the two); the slowdown is measured either way. `confidence`: of the
        slowdown's bound that is weighed (0.5: the estimate itself)."""
        self.name, self.slots = name, slots
        self.weigh_slowdown = weigh_slowdown
        self.z = NormalDist().inv_cdf(confidence)
        self.slowdown = DecodeSlowdown()
        self._prefill_gates: dict[str, PrefillGate] = {}  # by prefill worker URL
        self._decoding: Counter[str] = Counter()  # open decode streams by decode worker URL
        self._questions: Counter[object] = Counter()  # open decode streams by question
        self._state: tuple | None = None  # what the slowdown's segments must not see change

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

    def admits_warmup(self, url: str, benefit: float = 1.0) -> bool:
        """Whether the prefill worker at `url` may start a warm-up without taking a slot from
        another busy worker, and whether it pays for the decodes it slows (`benefit`: its
        successor's chance of being on the critical path)."""
        return len(self.busy_workers() | {url}) <= self.slots and self.warmup_pays(benefit)

    def warmup_pays(self, benefit: float) -> bool:
        if not self.weigh_slowdown:
            return True
        if warmup_pays(self.slowdown.shifted(self.z), len(self._questions), benefit):
            return True
        self.slowdown.refused()  # a reading that refuses for long is measured again
        return False

    def decode_started(self, url: str, question: object) -> None:
        """A decode stream of `question` (any hashable; a fresh object() when unknown) opened
        on the decode worker at `url`."""
        self._decoding[url] += 1
        self._questions[question] += 1
        self.notify()

    def decode_ended(self, url: str, question: object, stream: object = None) -> None:
        for counter, key in ((self._decoding, url), (self._questions, question)):
            counter[key] -= 1
            if counter[key] <= 0:
                del counter[key]
        self.slowdown.stream_ended(stream)
        self.notify()

    def decode_chunk(self, stream: object) -> None:
        """A chunk of `stream` (a key of the stream, any hashable) arrived."""
        self.slowdown.chunk(stream)

    def warmup_started(self) -> None:
        self.slowdown.warmup_started()

    def warmup_ended(self) -> None:
        self.slowdown.warmup_ended()

    def notify(self) -> None:
        """Wake every gate's waiters: one worker's change can open another worker's gate. A
        change of the open streams or critical prefills cuts the slowdown's segment."""
        state = (
            frozenset(self._decoding.items()),
            tuple(g.critical for g in self._prefill_gates.values()),
        )
        if state != self._state:
            self._state = state
            self.slowdown.disturbed()
        for gate in list(self._prefill_gates.values()):
            gate.wake()
