"""The shell router's own CPU on a shared CPU device: one single-threaded process that spends
`seconds_per_token` on every token it relays (stream parsing, the answer cache, waking warm-up
loops) and `seconds_per_request` on every request it sends (prompt building, tokenizing, HTTP).
On a CPU deployment it competes with the workers for the cores like a worker does; on GPUs it
runs on the host's CPU and is left out."""

from __future__ import annotations

from dataclasses import dataclass

import simpy

from simulation.device import Device

# The shell router's CPU per relayed token on this 2-core machine: 22.1 s of CPU (utime + stime
# from /proc/PID/stat) while it relayed ~15,500 tokens of tree_9_3_1_mixed_cpu questions (12
# question runs at concurrency 1 and 4), about 1.4 ms a token. A resource measurement of the
# router process, not a fit of any latency.
CPU_SECONDS_PER_TOKEN = 1.4e-3


@dataclass(frozen=True, slots=True)
class RouterCosts:
    seconds_per_token: float = 0.0
    seconds_per_request: float = 0.0


class RouterLoad:
    def __init__(self, env: simpy.Environment, device: Device, costs: RouterCosts) -> None:
        self.env, self.device, self.costs = env, device, costs
        self._backlog = 0.0
        self._work = env.event()
        env.process(self._loop())

    def tokens(self, n: int) -> None:
        self._add(n * self.costs.seconds_per_token)

    def request(self) -> None:
        self._add(self.costs.seconds_per_request)

    def _add(self, seconds: float) -> None:
        if seconds <= 0:
            return
        self._backlog += seconds
        if not self._work.triggered:
            self._work.succeed()

    def _loop(self):
        while True:
            if self._backlog <= 0:
                self._work = self.env.event()
                yield self._work
            # One process: whatever piled up runs as one stretch of work on one core.
            work, self._backlog = self._backlog, 0.0
            yield self.env.process(self.device.compute("shell_router", work))
