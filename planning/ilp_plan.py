"""`moa-pd plan --profile`: a plan and what it is judged against, every plan scored by the
simulator (the evaluator: simulation.predict.predict_plan).

1. The MILP (planning.ilp) proposes a placement; the naive and greedy baselines are proposals too.
2. The best proposal, as the simulator scores it at the given concurrency, is refined by a local
   search (planning.search) within a time budget: the plan is the best of all of these.
3. The plan is reported beside the MILP's proposal and the baselines `naive`, `greedy`, `paper`
   (each worker on GPUs of its own, as many as that takes) and `naive_layer_barrier` (setting #7,
   a barrier after each layer, on the naive placement), and against two bounds on throughput:
   Little's law (Q ÷ the lowest latency one question has alone) and capacity (the devices ÷ the
   device-seconds a question costs)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from planning import baselines
from planning.cost_model import RoleWork, role_work
from planning.devices import Cluster
from planning.ilp import PlacedReplica, model_tps, solve
from planning.pack import PlanError
from planning.plan_file import DeploymentPlan, PlannedNode, Prediction
from planning.planned_workers import planned_workers
from planning.prompt_length import DEFAULT_QUESTION_TOKENS
from planning.search import SearchResult, refine, score_key, signature
from planning.types import SEARCH_SECONDS, Mode
from profiling.profile_file import Profile
from router.config import ModelSpec, TopologyConfig

# The search scores each candidate on this many waves of `concurrency` questions (the report on
# predict_plan's default, four): two are enough to rank plans, and twice as fast.
SEARCH_WAVES = 2
ALONE_QUESTIONS = 4  # one question alone: identical questions, the first few warm the caches
PIPELINED, LAYER_BARRIER = 3, 7  # the settings plans are scored on


class Evaluator(Protocol):
    """simulation.predict.predict_plan's signature: the plan's predicted numbers."""

    def __call__(
        self,
        plan: DeploymentPlan,
        configs: list[TopologyConfig],
        profile: Profile,
        concurrency: int,
        *,
        setting: int = PIPELINED,
        questions: int | None = None,
        question_tokens: int = DEFAULT_QUESTION_TOKENS,
    ) -> Prediction: ...


@dataclass(frozen=True, slots=True)
class Scored:
    """One plan of the comparison, as the simulator predicts it; or why it does not fit."""

    name: str
    plan: DeploymentPlan | None
    prediction: Prediction | None
    setting: int = PIPELINED
    error: str = ""
    devices: int = 0  # GPUs (or cores) it uses


@dataclass(frozen=True, slots=True)
class Bounds:
    """Upper bounds on throughput at the plan's concurrency Q, for this workload and these
    devices. Little's law: Q ÷ `alone_s`, the lowest latency one question has alone (the least
    over the plans scored; the paper's layout, where nothing shares a GPU, on a GPU cluster).
    Capacity: the devices ÷ the device-seconds a question costs (the cost model's work in a round
    of Q questions, one replica per role, ÷ Q)."""

    little_qps: float
    capacity_qps: float
    alone_s: float
    device_seconds_per_question: float
    devices: int


@dataclass(frozen=True, slots=True)
class PlanReport:
    """`moa-pd plan`'s answer: the chosen plan first among `scored`, the bounds, the time the
    MILP and the search took (`solve_s`) and the search's record."""

    scored: list[Scored]
    bounds: Bounds
    solve_s: float
    search: SearchResult
    chosen: str = "plan"

    @property
    def plan(self) -> DeploymentPlan:
        return self.scored[0].plan

    def to_json(self) -> dict:
        plans = {}
        for s in self.scored:
            if s.prediction is None:
                plans[s.name] = {"error": s.error}
                continue
            p = s.prediction
            plans[s.name] = {
                "throughput_qps": p.throughput_qps,
                "latency_median_s": p.latency_median_s,
                "latency_p90_s": p.latency_p90_s,
                "workers": len(s.plan.workers),
                "devices": s.devices,
                "setting": s.setting,
                "of_little": p.throughput_qps / self.bounds.little_qps,
                "of_capacity": p.throughput_qps / self.bounds.capacity_qps,
            }
        b = self.bounds
        return {
            "chosen": self.chosen,
            "concurrency": self.plan.predicted.concurrency,
            "plans": plans,
            "bounds": {
                "little_qps": b.little_qps,
                "capacity_qps": b.capacity_qps,
                "alone_s": b.alone_s,
                "device_seconds_per_question": b.device_seconds_per_question,
                "devices": b.devices,
            },
            "solve_s": self.solve_s,
            "search": {
                "evaluations": self.search.evaluations,
                "seconds": self.search.seconds,
                "converged": self.search.converged,
                "accepted": self.search.accepted,
            },
        }


@dataclass(frozen=True, slots=True)
class PlanRequest:
    configs: list[TopologyConfig]
    config_paths: list[str]
    profile: Profile
    profile_path: str
    cluster: Cluster
    concurrency: int
    mode: Mode = "replicate"
    question_tokens: int = DEFAULT_QUESTION_TOKENS
    headroom_mib: int = 6144
    hosts: tuple[str, ...] = ()  # one per node; default 127.0.0.{k+1}
    search_s: float = SEARCH_SECONDS


def _specs(configs: list[TopologyConfig]) -> dict[str, ModelSpec]:
    return {name: spec for cfg in configs for name, spec in cfg.models.items()}


class Planner:
    """One request's plans, built as DeploymentPlans and scored by the evaluator (public for the
    benchmarks, which search beyond the planner's budget)."""

    def __init__(self, req: PlanRequest, evaluate: Evaluator) -> None:
        if req.concurrency < 1:
            raise PlanError(f"--concurrency must be at least 1, got {req.concurrency}")
        self.req, self.evaluate = req, evaluate
        self.work: dict[tuple[str, str], RoleWork] = role_work(
            req.configs, req.profile, req.concurrency, req.question_tokens
        )
        self.specs = _specs(req.configs)
        self.tp_sizes = {
            m: int(s.server_args.get("sglang", {}).get("tp_size", 0)) for m, s in self.specs.items()
        }

    def deployment_plan(
        self, placed: list[PlacedReplica], cluster: Cluster | None = None
    ) -> DeploymentPlan:
        req, cluster = self.req, cluster or self.req.cluster
        hosts = req.hosts or tuple(f"127.0.0.{k + 1}" for k in range(len(cluster.nodes)))
        if len(hosts) < len(cluster.nodes):
            raise PlanError(f"--hosts names {len(hosts)} host(s) for {len(cluster.nodes)} node(s)")
        return DeploymentPlan(
            configs=req.config_paths,
            profile=req.profile_path,
            backend=req.profile.backend,
            mode=req.mode,
            nodes=[PlannedNode(name=n, host=h) for n, h in zip(cluster.nodes, hosts, strict=False)],
            workers=planned_workers(placed, self.work, cluster, req.headroom_mib, req.concurrency),
            predicted=Prediction(
                concurrency=req.concurrency,
                latency_median_s=0.0,
                latency_p90_s=0.0,
                throughput_qps=0.0,
            ),
        )

    def predict(
        self,
        plan: DeploymentPlan,
        concurrency: int | None = None,
        setting: int = PIPELINED,
        questions: int | None = None,
    ) -> Prediction:
        req = self.req
        return self.evaluate(
            plan,
            req.configs,
            req.profile,
            concurrency or req.concurrency,
            setting=setting,
            questions=questions,
            question_tokens=req.question_tokens,
        )

    def search_score(self, placed: list[PlacedReplica]) -> Prediction:
        waves = SEARCH_WAVES * self.req.concurrency
        return self.predict(self.deployment_plan(placed), questions=max(8, waves))

    def proposals(self) -> tuple[dict[str, list[PlacedReplica] | str], dict]:
        """{name: placement or why none}, and the MILP's record."""
        req, work = self.req, self.work
        sol = solve(work, req.cluster, req.mode, req.headroom_mib, self.tp_sizes)
        solver = {
            "name": "scipy.optimize.milp (HiGHS) + local search",
            "status": sol.status,
            "milp_seconds": round(sol.seconds, 3),
            "milp_objective_s": round(sol.objective_s, 4),
            "variables": sol.variables,
            "constraints": sol.constraints,
            "predictor": "simulation.predict",
        }
        out: dict[str, list[PlacedReplica] | str] = {"ilp": sol.replicas}
        builds = {
            "naive": lambda: baselines.naive(work, req.cluster, req.headroom_mib, self.tp_sizes),
            "greedy": lambda: baselines.greedy(
                work, self.specs, req.cluster, req.headroom_mib, req.concurrency
            ),
        }
        for name, build in builds.items():
            try:
                out[name] = build()
            except PlanError as e:
                out[name] = str(e)
        return out, solver

    def refine(
        self, start: list[PlacedReplica], prediction: Prediction, budget_s: float
    ) -> SearchResult:
        """planning.search's local search from `start` (scored `prediction`), on this request."""
        req = self.req
        return refine(
            start,
            prediction,
            self.search_score,
            self.work,
            req.cluster,
            self.tps(),
            req.mode,
            req.headroom_mib,
            budget_s,
        )

    def tps(self) -> dict[tuple[str, str], list[int]]:
        req = self.req
        return {
            k: model_tps(w, req.cluster, req.mode, req.headroom_mib, self.tp_sizes.get(k[0], 0))
            for k, w in self.work.items()
        }

    def bounds(self, alone_s: float) -> Bounds:
        """Little's law from `alone_s`; capacity from the cost model's round of Q questions."""
        q = self.req.concurrency
        per_question = sum(w.fixed_s + w.shared_s for w in self.work.values()) / q
        devices = len(self.req.cluster.devices)
        return Bounds(q / alone_s, devices / per_question, alone_s, per_question, devices)


def plan_with_ilp(req: PlanRequest, evaluate: Evaluator) -> PlanReport:
    """The plan (the best of the MILP's proposal, the naive and greedy baselines and the local
    search from the best of them) first, then the MILP's proposal and the baselines, each scored
    by `evaluate`. PlanError when no placement fits."""
    planner = Planner(req, evaluate)
    start = time.perf_counter()
    proposals, solver = planner.proposals()
    scores: dict[str, Prediction] = {}
    for name, placed in proposals.items():
        if isinstance(placed, str):
            continue
        try:
            scores[name] = planner.search_score(placed)
        except PlanError as e:  # fits the memory, but not as its workers start in turns
            proposals[name] = str(e)
    if not scores:
        raise PlanError(f"no proposal can be started: {proposals['ilp']}")
    fitting = {n: p for n, p in proposals.items() if not isinstance(p, str)}
    best = max(scores, key=lambda n: score_key(scores[n]))
    budget = max(0.0, req.search_s - (time.perf_counter() - start))
    search = planner.refine(fitting[best], scores[best], budget)
    solve_s = time.perf_counter() - start
    solver |= {
        "seconds": round(solve_s, 3),
        "search_from": best,
        "search_evaluations": search.evaluations,
        "search_seconds": round(search.seconds, 3),
        "search_converged": int(search.converged),
    }
    devices = len(req.cluster.devices)
    # Scored on predict_plan's default question count: the plan is the best of all candidates
    # there (the search ranked them on fewer questions).
    candidates: list[Scored] = []
    # The search's plan is a candidate of its own where it moved off its start (else it is that
    # proposal, scored below).
    moved = signature(search.placed) != signature(fitting[best])
    for name, placed in [*([("searched", search.placed)] if moved else []), *proposals.items()]:
        if isinstance(placed, str):
            candidates.append(Scored(name, None, None, error=placed))
            continue
        plan = planner.deployment_plan(placed)
        candidates.append(Scored(name, plan, planner.predict(plan), devices=devices))
    fits = [s for s in candidates if s.prediction is not None]
    chosen = max(fits, key=lambda s: score_key(s.prediction))
    others = [s for s in candidates if s.name != "searched"]
    try:
        placed, own = baselines.paper(planner.work, req.cluster, req.headroom_mib, planner.tp_sizes)
        plan = planner.deployment_plan(placed, own)
        others.append(Scored("paper", plan, planner.predict(plan), devices=len(own.devices)))
    except PlanError as e:
        others.append(Scored("paper", None, None, error=str(e)))
    naive = next(s for s in candidates if s.name == "naive")
    if naive.plan is not None:
        barrier = planner.predict(naive.plan, setting=LAYER_BARRIER)
        others.append(
            Scored("naive_layer_barrier", naive.plan, barrier, LAYER_BARRIER, devices=devices)
        )
    else:
        others.append(Scored("naive_layer_barrier", None, None, LAYER_BARRIER, naive.error))
    # One question alone: on the plan, and where nothing shares a device (the paper's layout).
    alone = [
        planner.predict(s.plan, concurrency=1, questions=ALONE_QUESTIONS).latency_median_s
        for s in (chosen, *(o for o in others if o.name == "paper" and o.plan is not None))
    ]
    bounds = planner.bounds(min(alone))
    plan = chosen.plan.model_copy(
        update={
            "predicted": chosen.prediction,
            "solver": solver | {"chosen_from": chosen.name},
            "baselines": {s.name: s.prediction for s in others if s.prediction is not None},
            "bounds": {"little_qps": bounds.little_qps, "capacity_qps": bounds.capacity_qps},
        }
    )
    first = Scored("plan", plan, chosen.prediction, devices=devices)
    return PlanReport([first, *others], bounds, solve_s, search)
