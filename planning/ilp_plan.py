"""`moa-pd plan --profile`: the MILP plan and its two baselines as DeploymentPlans, each scored by
an evaluator (the simulator's predict_plan; the cost model's round estimate where none is given)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from planning import baselines
from planning.cost_model import RoleWork, critical_path_seconds, device_loads, role_work
from planning.devices import Cluster
from planning.ilp import PlacedReplica, solve
from planning.pack import PlanError
from planning.plan_file import DeploymentPlan, PlannedNode, Prediction
from planning.planned_workers import planned_workers
from planning.types import Mode
from profiling.profile_file import Profile
from router.config import ModelSpec, TopologyConfig

# plan, configs, profile, concurrency -> its predicted numbers (simulation.predict.predict_plan).
Evaluator = Callable[[DeploymentPlan, list[TopologyConfig], Profile, int], Prediction]


@dataclass(frozen=True, slots=True)
class Scored:
    """One plan of the comparison: its load in a round under the cost model (the MILP's
    objective, evaluated on it) and what the evaluator predicts; or why it does not fit."""

    name: str
    plan: DeploymentPlan | None
    objective_s: float | None
    prediction: Prediction | None
    error: str = ""


@dataclass(frozen=True, slots=True)
class PlanRequest:
    configs: list[TopologyConfig]
    config_paths: list[str]
    profile: Profile
    profile_path: str
    cluster: Cluster
    concurrency: int
    mode: Mode = "replicate"
    question_tokens: int = 256
    headroom_mib: int = 6144
    hosts: tuple[str, ...] = ()  # one per node; default 127.0.0.{k+1}


def round_estimate(objective_s: float, critical_s: float, concurrency: int) -> Prediction:
    """The cost model's own prediction: a round takes its busiest device's load, or a question's
    critical path if longer; every question in flight finishes within it."""
    seconds = max(objective_s, critical_s)
    return Prediction(
        concurrency=concurrency,
        latency_median_s=seconds,
        latency_p90_s=seconds,
        throughput_qps=concurrency / seconds if seconds > 0 else 0.0,
    )


def _specs(configs: list[TopologyConfig]) -> dict[str, ModelSpec]:
    return {name: spec for cfg in configs for name, spec in cfg.models.items()}


def _deployment_plan(
    req: PlanRequest,
    placed: list[PlacedReplica],
    work: dict[tuple[str, str], RoleWork],
    objective_s: float,
    critical_s: float,
    solver: dict[str, str | float | int],
) -> DeploymentPlan:
    hosts = req.hosts or tuple(f"127.0.0.{k + 1}" for k in range(len(req.cluster.nodes)))
    if len(hosts) != len(req.cluster.nodes):
        raise PlanError(f"--hosts names {len(hosts)} host(s) for {len(req.cluster.nodes)} node(s)")
    return DeploymentPlan(
        configs=req.config_paths,
        profile=req.profile_path,
        backend=req.profile.backend,
        mode=req.mode,
        nodes=[PlannedNode(name=n, host=h) for n, h in zip(req.cluster.nodes, hosts, strict=True)],
        workers=planned_workers(placed, work, req.cluster, req.headroom_mib, req.concurrency),
        predicted=round_estimate(objective_s, critical_s, req.concurrency),
        solver=solver,
    )


def plan_with_ilp(req: PlanRequest, evaluate: Evaluator | None = None) -> list[Scored]:
    """[the MILP's plan, naive, greedy], each scored; the first carries the others' predictions
    as its baselines. PlanError when the MILP finds no plan (the baselines may fail alone)."""
    if req.concurrency < 1:
        raise PlanError(f"--concurrency must be at least 1, got {req.concurrency}")
    work = role_work(req.configs, req.profile, req.concurrency, req.question_tokens)
    specs = _specs(req.configs)
    tp_sizes = {m: int(s.server_args.get("sglang", {}).get("tp_size", 0)) for m, s in specs.items()}
    sol = solve(work, req.cluster, req.mode, req.headroom_mib, tp_sizes)
    predictor = "simulation.predict" if evaluate else "cost model (round estimate)"
    solver = {
        "name": "scipy.optimize.milp (HiGHS)",
        "status": sol.status,
        "seconds": round(sol.seconds, 3),
        "objective_s": round(sol.objective_s, 4),
        "variables": sol.variables,
        "constraints": sol.constraints,
        "predictor": predictor,
    }
    candidates: list[tuple[str, list[PlacedReplica] | str]] = [("plan", sol.replicas)]
    for name, build in (
        ("naive", lambda: baselines.naive(work, req.cluster, req.headroom_mib, tp_sizes)),
        (
            "greedy",
            lambda: baselines.greedy(work, specs, req.cluster, req.headroom_mib, req.concurrency),
        ),
    ):
        try:
            candidates.append((name, build()))
        except PlanError as e:
            candidates.append((name, str(e)))
    scored = []
    for name, placed in candidates:
        if isinstance(placed, str):
            scored.append(Scored(name, None, None, None, placed))
            continue
        replicas = [p.replica for p in placed]
        objective = max(device_loads(replicas, work).values())
        critical = critical_path_seconds(
            req.configs, req.profile, req.concurrency, req.question_tokens, replicas
        )
        plan = _deployment_plan(
            req, placed, work, objective, critical, solver if name == "plan" else {}
        )
        prediction = (
            evaluate(plan, req.configs, req.profile, req.concurrency)
            if evaluate
            else plan.predicted
        )
        plan = plan.model_copy(update={"predicted": prediction})
        scored.append(Scored(name, plan, objective, prediction))
    best = scored[0].plan
    extra = {s.name: s.prediction for s in scored[1:] if s.prediction is not None}
    scored[0] = Scored(
        "plan",
        best.model_copy(update={"baselines": extra}),
        scored[0].objective_s,
        scored[0].prediction,
    )
    return scored
