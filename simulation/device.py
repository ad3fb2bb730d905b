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
        self._busy[worker] = self._busy.get(worker, 0) + 1
        self._kick()
        remaining = seconds
        try:
            while remaining > 1e-12:
                rate, t0, changed = self.speed(), self.env.now, self._changed.wait()
                yield self.env.timeout(remaining / rate) | changed
                remaining -= (self.env.now - t0) * rate
        finally:
            self.busy_seconds += seconds
            self._busy[worker] -= 1
            if not self._busy[worker]:
                del self._busy[worker]
            self._kick()

    def _kick(self) -> None:
        """Every running computation re-reads its speed."""
        self._changed.fire()


class TPGroup:
    """A worker's tensor-parallel GPUs, as one thing to compute on (the `Device.compute`
    interface)."""

    def __init__(self, env: simpy.Environment, name: str, members: list[Device]) -> None:
        from planning.cost_model import tp_speedup

        self.env, self.name, self.members = env, name, members
        self.speedup = tp_speedup(len(members))

    @property
    def busy_seconds(self) -> float:
        return sum(m.busy_seconds for m in self.members) / len(self.members)

    def speed(self) -> float:
        return min(m.speed() for m in self.members)

    def compute(self, worker: str, seconds: float):
        """simpy process body: `seconds` of one GPU's work, split over the group's GPUs."""
        for m in self.members:
            m._busy[worker] = m._busy.get(worker, 0) + 1
            m._kick()
        remaining = seconds / self.speedup
        try:
            while remaining > 1e-12:
                rate, t0 = self.speed(), self.env.now
                changed = simpy.AnyOf(self.env, [m._changed.wait() for m in self.members])
                yield self.env.timeout(remaining / rate) | changed
                remaining -= (self.env.now - t0) * rate
        finally:
            for m in self.members:
                m.busy_seconds += seconds / self.speedup
                m._busy[worker] -= 1
                if not m._busy[worker]:
                    del m._busy[worker]
                m._kick()
