"""A deployment plan as written by `moa-pd plan --out plan.json` and started by
`moa-pd up --plan plan.json [--node NAME]`: which replicas each model gets, on which node and
device, how a model's requests are split among its replicas, and what the simulator predicts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA = "moa-pd.plan/1"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlannedNode(_Strict):
    name: str  # "node0"; `up --plan --node NAME` starts this node's workers
    host: str  # the address its workers bind to and advertise (127.0.0.2 in the loopback test)


class PlannedWorker(_Strict):
    model: str  # the config's model name
    role: Literal["prefill", "decode"]
    replica: int  # 0.. within (model, role)
    node: str
    gpus: list[int] = []  # indices on its node, one per TP rank; empty on CPU
    cpus: list[int] = []  # cores it is pinned to (CPU plans); empty: not pinned
    tp: int = 1
    pool_tokens: int  # --max-total-tokens
    mem_fraction_static: float | None = None  # SGLang's, when it shares a GPU
    turn: int = 0  # start order on its device(s)
    share: float = Field(gt=0, le=1)  # fraction of the model's requests of this role sent here

    @property
    def name(self) -> str:
        """The worker's process name, as launch.stack names it."""
        return f"{self.model}.{self.role}{self.replica}"


class Prediction(_Strict):
    concurrency: int
    latency_median_s: float
    latency_p90_s: float
    throughput_qps: float  # questions per second
    # The simulator's: the fraction of the run each device computed, by the simulator's device
    # names ("node0:gpu1"; a TP group "node0:gpu0,1"; "node0:cpu" for unpinned cores). The local
    # search relieves the busiest first (planning.search); empty where nothing simulated it.
    device_utilization: dict[str, float] = {}


class DeploymentPlan(_Strict):
    schema_: Literal["moa-pd.plan/1"] = Field(SCHEMA, alias="schema")
    configs: list[str]  # the topology configs it was planned for (paths as given)
    profile: str  # the profile.json its costs came from
    backend: Literal["torch", "sglang"]
    mode: Literal["replicate", "fixed"]  # MOSAIC's dynamic replication, or fixed placement
    nodes: list[PlannedNode] = Field(min_length=1)
    workers: list[PlannedWorker] = Field(min_length=2)
    predicted: Prediction
    # The same workload on other plans: "ilp" (the MILP's proposal), "naive", "greedy", "paper",
    # "naive_layer_barrier" (planning.ilp_plan).
    baselines: dict[str, Prediction] = {}
    bounds: dict[str, float] = {}  # "little_qps", "capacity_qps": upper bounds on throughput
    solver: dict[str, str | float | int] = {}  # name, status, seconds, the search's record

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @classmethod
    def load(cls, path: str | Path) -> DeploymentPlan:
        return cls.model_validate_json(Path(path).read_text())

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(self.model_dump_json(by_alias=True, indent=2) + "\n")

    def node(self, name: str) -> PlannedNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node '{name}' in the plan; it has {[n.name for n in self.nodes]}")
