"""A deployment plan (planning/plan_file.py) as the launcher starts it: checked against the
configs it serves (errors name the plan's JSON path), then turned into what `Stack` already
consumes: each model's replica counts, a `Placement` of one node's workers, their request shares.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from launch.procs import LaunchError
from planning.plan_file import DeploymentPlan, PlannedWorker
from planning.types import Placement, WorkerDemand, WorkerPlacement
from router.config import ModelSpec, Workers

# Shares are the ILP's floats, written rounded; anything closer to 1 than this is 1.
SHARE_TOLERANCE = 1e-3


def load_plan(path: str | Path) -> DeploymentPlan:
    """plan.json read and validated, or LaunchError naming the file and the field."""
    p = Path(path)
    try:
        return DeploymentPlan.load(p)
    except FileNotFoundError:
        raise LaunchError(f"plan file {p} does not exist; write one with `moa-pd plan`") from None
    except ValidationError as e:
        where = "; ".join(
            f"{'.'.join(map(str, err['loc'])) or '(top level)'}: {err['msg']}" for err in e.errors()
        )
        raise LaunchError(f"plan file {p} is invalid: {where}") from None


def check_plan(plan: DeploymentPlan, path: str, models: dict[str, ModelSpec]) -> None:
    """Raise LaunchError for the first thing in the plan that cannot be started with the
    configs' `models`, naming `path` and the JSON path: a node named twice, a worker on an
    unknown node or of a model no config has, a replica named twice or a gap in a model's
    replica numbers, GPUs that do not match tp (or any GPU setting for the CPU-only reference
    engine), shares of a (model, role) that do not sum to 1,
    a model of the configs without a prefill or a decode worker. (A plan names no ports: each
    node draws its own, free on its host, when it starts; see launch/ports.py.)"""

    def fail(where: str, what: str) -> LaunchError:
        return LaunchError(f"plan {path}: {where}: {what}")

    nodes: dict[str, int] = {}
    for i, n in enumerate(plan.nodes):
        if n.name in nodes:
            raise fail(f"nodes[{i}].name", f"node '{n.name}' is also nodes[{nodes[n.name]}]")
        nodes[n.name] = i
    seen: dict[str, int] = {}
    by_role: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, w in enumerate(plan.workers):
        if w.node not in nodes:
            raise fail(
                f"workers[{i}].node",
                f"unknown node '{w.node}'; the plan's nodes are {', '.join(nodes)}",
            )
        if w.model not in models:
            raise fail(
                f"workers[{i}].model",
                f"model '{w.model}' is in none of the configs (they have "
                f"{', '.join(sorted(models))}); plan for these configs or pass the right --config",
            )
        if w.name in seen:
            raise fail(f"workers[{i}]", f"{w.name} is also workers[{seen[w.name]}]")
        seen[w.name] = i
        if w.gpus and len(w.gpus) != w.tp:
            raise fail(f"workers[{i}].gpus", f"{len(w.gpus)} GPUs for tp {w.tp}; give one per rank")
        if plan.backend == "torch":  # the reference engine runs on CPU cores only
            for key, bad in (
                ("gpus", bool(w.gpus)),
                ("tp", w.tp > 1),
                ("mem_fraction_static", w.mem_fraction_static is not None),
            ):
                if bad:
                    raise fail(
                        f"workers[{i}].{key}",
                        'backend "torch" (the reference engine) runs on CPU: leave it out, or '
                        'plan for backend "sglang"',
                    )
        by_role[(w.model, w.role)].append(i)
    for (model, role), idx in by_role.items():
        replicas = sorted(plan.workers[i].replica for i in idx)
        if replicas != list(range(len(idx))):
            raise fail(
                f"workers[{','.join(map(str, idx))}].replica",
                f"{model} {role} replicas are {replicas}; number them 0..{len(idx) - 1}",
            )
        total = sum(plan.workers[i].share for i in idx)
        if abs(total - 1) > SHARE_TOLERANCE:
            raise fail(
                f"workers[{','.join(map(str, idx))}].share",
                f"the shares of {model}'s {role} workers sum to {total:.4g}, not 1",
            )
    for model in models:
        for role in ("prefill", "decode"):
            if (model, role) not in by_role:
                raise fail("workers", f"model '{model}' has no {role} worker; add one")


@dataclass(frozen=True, slots=True)
class PlanSlice:
    """The part of a checked plan one `moa-pd up` starts: `node`'s workers, or every worker
    (node None: a one-node plan started whole)."""

    plan: DeploymentPlan
    node: str | None

    @property
    def host(self) -> str:
        """The address this part's processes bind to and advertise."""
        return self.plan.node(self.node).host if self.node else self.plan.nodes[0].host

    @property
    def workers(self) -> list[PlannedWorker]:
        return [w for w in self.plan.workers if self.node is None or w.node == self.node]

    def replica_counts(self, model: str) -> Workers:
        """The model's replicas on all nodes, as the config's `workers` would give them."""
        roles = [w.role for w in self.plan.workers if w.model == model]
        return Workers(prefill=roles.count("prefill"), decode=roles.count("decode"))

    def local_replicas(self, model: str, role: str) -> list[int]:
        return sorted(w.replica for w in self.workers if (w.model, w.role) == (model, role))

    def shares(self, model: str, role: str) -> list[float]:
        """The model's request split over its `role` replicas (all nodes), in replica order."""
        ws = sorted(
            (w for w in self.plan.workers if (w.model, w.role) == (model, role)),
            key=lambda w: w.replica,
        )
        return [w.share for w in ws]

    def cpus(self, name: str) -> list[int]:
        return next(w.cpus for w in self.plan.workers if w.name == name)

    def placement(self) -> Placement:
        """This part's workers as the stack places them: devices, pool, start turn. Memory
        figures stay 0: the plan was sized by its planner, not by planning/pack.py."""
        placed = [
            WorkerPlacement(
                WorkerDemand(w.model, w.role, w.replica, w.tp, 0, 0, w.pool_tokens),
                tuple(w.gpus),
                w.pool_tokens,
                w.turn,
                w.mem_fraction_static,
            )
            for w in self.workers
        ]
        return Placement("plan", 1, [], 0, placed)

    def on_gpus(self) -> bool:
        return any(w.gpus for w in self.workers)


def node_names_error(plan: DeploymentPlan, path: str) -> str:
    """What to do with a plan that spans nodes when no --node or --join was given."""
    names = ", ".join(n.name for n in plan.nodes)
    return (
        f"plan {path} spans nodes {names}: start each node's workers with `moa-pd up --plan "
        f"{path} --node NAME --run-dir DIR`, then the routers with `moa-pd up --plan {path} "
        "--join DIR --join DIR ...` (launch/slurm/moa_pd.sbatch does both)"
    )
