"""A compute device several workers share, as processor sharing: each busy worker needs one of
the device's `slots` while it computes (a core on a CPU: every worker process runs one thread);
with more busy workers than slots every one of them runs at slots / busy of its speed. A GPU is
modelled the same way with one slot: the kernels of workers sharing it time-slice, so two busy
workers each take twice as long (pessimistic for small decode batches, which leave the GPU idle
part of the time; no MPS or overlap is modelled). `co_run_slowdown` is what co-running costs
beyond the slot count: k busy workers on a device of n > 1 slots also run at 1 / (1 + β·(min(k,
n) - 1)) of their speed (shared caches and memory bandwidth, or SMT siblings under a VM's
vCPUs); β = 0 is perfect scaling. `oversubscribed_slowdown` γ is what time-slicing k > n busy
workers costs beyond n / k (switches, caches refilled): 1 / (1 + γ·(k - n) / n) more. Both are
measured by profiling/co_run.py.

A tensor-parallel group (`TPGroup`) computes on all its GPUs at once: it is busy on each of them
(so it time-shares every one with the workers placed there too) and progresses at the pace of its
slowest GPU, `tp_speedup(n)` faster than one GPU alone (the planner's cost model's efficiency).
"""

from __future__ import annotations

import simpy

from planning.cost_model import tp_speedup
from simulation.signal import Signal


class Device:
    def __init__(
        self,
        env: simpy.Environment,
        name: str,
        slots: int,
        co_run_slowdown: float = 0.0,
        oversubscribed_slowdown: float = 0.0,
    ) -> None:
        if slots < 1:
            raise ValueError(f"device '{name}' has {slots} slots; it needs at least 1")
        self.env, self.name, self.slots = env, name, slots
        self.co_run_slowdown = co_run_slowdown
        self.oversubscribed_slowdown = oversubscribed_slowdown
        self._busy: dict[str, int] = {}  # worker -> computations running
        self._changed = Signal(env)
        self.busy_seconds = 0.0  # worker-seconds of computation at any speed (utilisation)

    @property
    def busy_workers(self) -> int:
        return len(self._busy)

    def speed(self) -> float:
        """Fraction of full speed each busy worker computes at now."""
        busy = max(1, len(self._busy))
        co_run = 1 + self.co_run_slowdown * (min(busy, self.slots) - 1)
        oversubscribed = 1 + self.oversubscribed_slowdown * max(0, busy - self.slots) / self.slots
        return min(1.0, self.slots / busy) / (co_run * oversubscribed)

    def compute(self, worker: str, seconds: float):
        """simpy process body: `seconds` of `worker`'s work at full speed, slowed while the
        device is oversubscribed. Use as `yield env.process(device.compute(w, s))`."""
        yield from _compute(self.env, [self], worker, seconds)

    def enter(self, worker: str) -> None:
        """`worker` starts a computation here (every running one re-reads its speed)."""
        self._busy[worker] = self._busy.get(worker, 0) + 1
        self._changed.fire()

    def leave(self, worker: str, seconds: float) -> None:
        """`worker`'s computation of `seconds` (at full speed) ended here."""
        self.busy_seconds += seconds
        self._busy[worker] -= 1
        if not self._busy[worker]:
            del self._busy[worker]
        self._changed.fire()

    def changed(self) -> simpy.Event:
        """An event for the next change of who computes here."""
        return self._changed.wait()


class TPGroup:
    """A worker's tensor-parallel GPUs, as one thing to compute on (the `Device.compute`
    interface)."""

    def __init__(self, env: simpy.Environment, name: str, members: list[Device]) -> None:
        self.env, self.name, self.members = env, name, members
        self.speedup = tp_speedup(len(members))

    def compute(self, worker: str, seconds: float):
        """simpy process body: `seconds` of one GPU's work, split over the group's GPUs."""
        yield from _compute(self.env, self.members, worker, seconds / self.speedup)


def _compute(env: simpy.Environment, devices: list[Device], worker: str, seconds: float):
    """`seconds` of work computed on all `devices` at once, at the slowest one's speed."""
    for d in devices:
        d.enter(worker)
    remaining = seconds
    try:
        while remaining > 1e-12:
            rate, t0 = min(d.speed() for d in devices), env.now
            changed = (  # one device: its own event, cheaper than AnyOf (planner's many runs)
                devices[0].changed()
                if len(devices) == 1
                else simpy.AnyOf(env, [d.changed() for d in devices])
            )
            yield env.timeout(remaining / rate) | changed
            remaining -= (env.now - t0) * rate
    finally:
        for d in devices:
            d.leave(worker, seconds)
