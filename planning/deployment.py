"""A deployment's plan from its configs: one demand per worker (weights and KV from the model's
config.json, pool from the agents), then placement on the GPUs given."""

from __future__ import annotations

from dataclasses import dataclass, replace

from planning.model_memory import ModelConfigError, model_memory
from planning.pack import HEADROOM_MIB, PlanError, check_headroom, choose_tp, place
from planning.pool_need import DEFAULT_QUESTION_TOKENS, pool_needs, unused_models
from planning.types import GPU, Placement, Policy, WorkerDemand
from router.config import ModelSpec, TopologyConfig


@dataclass(frozen=True, slots=True)
class ModelToPlace:
    name: str
    spec: ModelSpec
    model_path: str  # what the launcher resolved (a local dir, or an HF id SGLang loads)


def worker_demands(
    models: list[ModelToPlace],
    configs: list[TopologyConfig],
    gpus: list[GPU],
    concurrency: int = 1,
    question_tokens: int = DEFAULT_QUESTION_TOKENS,
    headroom_mib: int = HEADROOM_MIB,
) -> list[WorkerDemand]:
    """Every prefill and decode replica of every model, with its tp (the config's tp_size, else
    the smallest that fits one of `gpus`)."""
    if unused := unused_models(configs):  # its pool would be 0 (--max-total-tokens 0)
        raise PlanError(unused)
    needs = pool_needs(configs, concurrency, question_tokens)
    demands = []
    for m in models:
        args = m.spec.server_args.get("sglang", {})
        try:
            mem = model_memory(
                m.model_path,
                str(args.get("dtype", "auto")),
                str(args.get("kv_cache_dtype", "auto")),
            )
        except ModelConfigError as e:
            raise PlanError(f"models.{m.name}.model_path: {e}") from None
        for role, replicas in (
            ("prefill", m.spec.workers.prefill),
            ("decode", m.spec.workers.decode),
        ):
            # A pool the config asks for (server_args.sglang.max_total_tokens) is kept if larger.
            pool = max(needs.get((m.name, role), 0), int(args.get("max_total_tokens", 0)))
            for i in range(replicas):
                d = WorkerDemand(
                    m.name, role, i, 1, mem.weights_bytes, mem.kv_bytes_per_token, pool
                )
                tp = int(args.get("tp_size", 0)) or choose_tp(d, gpus, headroom_mib)
                demands.append(replace(d, tp=tp))
    return demands


def plan_deployment(
    models: list[ModelToPlace],
    configs: list[TopologyConfig],
    gpus: list[GPU],
    policy: Policy = "pack",
    concurrency: int = 1,
    question_tokens: int = DEFAULT_QUESTION_TOKENS,
    headroom_mib: int = HEADROOM_MIB,
) -> Placement:
    """The placement of every worker on `gpus`, or PlanError naming what does not fit."""
    if concurrency < 1:
        raise PlanError(f"--concurrency must be at least 1, got {concurrency}")
    check_headroom(headroom_mib)  # before choose_tp uses it
    demands = worker_demands(models, configs, gpus, concurrency, question_tokens, headroom_mib)
    return place(demands, gpus, policy, concurrency, headroom_mib)
