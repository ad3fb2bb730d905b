"""The simulation of one workload on one deployment: builds the workers, devices and gates in a
simpy environment, feeds questions closed-loop (at most `concurrency` in flight, as `moa-pd run
--concurrency Q`) or at an open Poisson rate, and returns each question as a results row (the
runner's schema, so experiments/critical_path.py breaks it down the same way)."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import numpy as np
import simpy

from experiments.critical_path import PARTS, median_breakdown
from experiments.results import ResultRow
from profiling.profile_file import Profile
from router.config import TopologyConfig
from simulation.deployment import SimDeployment, is_gpu, tp_members
from simulation.device import Device, TPGroup
from simulation.gate import DeviceGate, PrefillGate
from simulation.question import QuestionRun
from simulation.router_load import CPU_SECONDS_PER_TOKEN, RouterCosts, RouterLoad
from simulation.workers import DecodeWorker, PrefillWorker, Replicas
from simulation.workload import QuestionWork


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a simulated workload gave: rows, wall time, and the summary numbers."""

    rows: list[ResultRow]
    makespan_s: float
    device_busy: dict[str, float]  # worker-seconds computed per device

    @property
    def e2e(self) -> np.ndarray:
        return np.array([r.e2e_s for r in self.rows])

    @property
    def median_s(self) -> float:
        return float(np.median(self.e2e))

    @property
    def p90_s(self) -> float:
        return float(np.percentile(self.e2e, 90))

    @property
    def throughput_qps(self) -> float:
        return len(self.rows) / self.makespan_s if self.makespan_s > 0 else 0.0

    def breakdown(self) -> dict[str, float]:
        return median_breakdown(self.rows) or dict.fromkeys(PARTS, 0.0)


class Simulation:
    def __init__(
        self,
        configs: list[TopologyConfig],
        profile: Profile,
        deployment: SimDeployment,
        exit_rate: float | None = None,
        seed: int = 0,
        priority_scheduling: bool = False,
        router_costs: RouterCosts | None = None,
        workflow_priority: bool = False,
        critical_path_first: bool = False,
    ) -> None:
        """`workflow_priority`: requests ranked by their question's start, the oldest first, at
        the decode workers' admission, the prefill workers' queues (with
        `priority_scheduling`) and the warm-up gates, as router/priority.py does; else FCFS.
        `critical_path_first`: a question whose work has no recorded start order starts its
        agents longest remaining path first (router/priority.start_order), else in the config's
        order (the router's default)."""
        self.env = simpy.Environment()
        self.configs = {c.name: c for c in configs}
        self.profile, self.deployment, self.exit_rate = profile, deployment, exit_rate
        self.seed = seed
        self.warm_order = itertools.count()  # the order successors' warm-ups start (gate queues)
        self.workflow_priority = workflow_priority
        self.critical_path_first = critical_path_first
        self.question_order = itertools.count()  # questions as they start (workflow priority)
        self.devices = {
            d: Device(self.env, d, s)
            if is_gpu(d)
            else Device(
                self.env, d, s, deployment.co_run_slowdown, deployment.oversubscribed_slowdown
            )
            for d, s in deployment.devices.items()
        }
        weighs = deployment.gate_weighs_slowdown
        dev_gates = {
            d: DeviceGate(self.env, s, deployment.gate_scope, weighs)
            for d, s in deployment.devices.items()
        }
        # What each worker computes on: its device, or its TP group's GPUs together.
        units: dict[str, Device | TPGroup] = dict(self.devices)
        for w in deployment.workers:
            if w.device not in units:
                members = [self.devices[m] for m in tp_members(w.device)]
                units[w.device] = TPGroup(self.env, w.device, members)
                dev_gates[w.device] = DeviceGate(self.env, 1, deployment.gate_scope, weighs)
        # The shell router shares the first CPU device (it runs beside the workers it fronts).
        cpu = next((d for d in self.devices if not is_gpu(d)), None)
        self.router = RouterLoad(
            self.env,
            self.devices[cpu] if cpu else Device(self.env, "host", 1),
            (router_costs or RouterCosts(CPU_SECONDS_PER_TOKEN)) if cpu else RouterCosts(),
        )
        self.replicas: dict[str, Replicas] = {}
        self.gates: dict[str, PrefillGate] = {}
        self.device_gates: dict[str, DeviceGate] = {}
        for w in deployment.workers:
            rep = self.replicas.setdefault(
                w.model, Replicas(rng=random.Random(f"{seed}/{w.model}"))
            )
            costs = profile.models[w.model]
            if w.role == "prefill":
                budget, chunk = deployment.prefill_args.get(w.model, (4096, 2048))
                worker = PrefillWorker(
                    self.env,
                    w.name,
                    costs,
                    units[w.device],
                    budget,
                    chunk,
                    priority_scheduling,
                )
                rep.prefill.append(worker)
                rep.prefill_share.append(w.share)
                self.gates[w.name] = PrefillGate(w.name, dev_gates[w.device])
            else:
                rep.decode.append(
                    DecodeWorker(
                        self.env,
                        w.name,
                        costs,
                        units[w.device],
                        deployment.decode_slots.get(w.model, 1 << 20),
                        self.router.tokens if self.router.costs.seconds_per_token > 0 else None,
                        dev_gates[w.device].decode_step,
                    )
                )
                rep.decode_share.append(w.share)
                self.device_gates[w.name] = dev_gates[w.device]

    def run(
        self,
        work: list[tuple[QuestionWork, int, str, bool]],
        concurrency: int | None = 1,
        rate_qps: float | None = None,
    ) -> Outcome:
        """Simulate `work` ((question, setting, mode, early exit) each) closed-loop at
        `concurrency`, or arriving at `rate_qps` (Poisson) when given."""
        rows: list[ResultRow] = []
        rng = random.Random(self.seed)
        queue = list(work)

        def one(item):
            q, setting, mode, ee = item
            run = QuestionRun(self, q, mode, ee, rng)
            agents, e2e = yield self.env.process(run.run())
            rows.append(
                ResultRow(
                    sample_id=q.qid,
                    dataset="simulated",
                    setting=setting,
                    e2e_s=e2e,
                    agents=agents,
                    config=q.config,
                    mode=mode,
                )
            )

        def client():
            while queue:
                yield self.env.process(one(queue.pop(0)))

        def arrivals():
            procs = []
            while queue:
                procs.append(self.env.process(one(queue.pop(0))))
                yield self.env.timeout(rng.expovariate(rate_qps))
            yield simpy.AllOf(self.env, procs)

        if rate_qps is not None:
            done = self.env.process(arrivals())
        else:
            done = simpy.AllOf(
                self.env, [self.env.process(client()) for _ in range(max(1, concurrency or 1))]
            )
        self.env.run(until=done)
        busy = {d: dev.busy_seconds for d, dev in self.devices.items()}
        return Outcome(rows, self.env.now, busy)
