"""A deployment's models as the launcher resolves them before anything starts: the configs'
models merged (one name, one model), each model's local paths, and `ModelPlan`, the endpoints of
its PD workers and native router. Used by launch/stack.py and `moa-pd plan`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from launch.procs import LaunchError
from planning.pool_need import unused_models
from router.config import ModelSpec, TopologyConfig


@dataclass(slots=True)
class ModelPlan:
    """Endpoints of one model's PD deployment."""

    name: str
    spec: ModelSpec
    model_path: str  # resolved: a local HF directory (torch) or what SGLang loads (sglang)
    tokenizer_path: str
    prefill_ports: list[int] = field(default_factory=list)
    bootstrap_ports: list[int] = field(default_factory=list)
    decode_ports: list[int] = field(default_factory=list)
    router_port: int = 0
    # Which replicas this deployment starts (all of the config's `workers`, or one node's share
    # of a plan), in the order of the port lists; None: 0..workers-1.
    prefill_replicas: list[int] | None = None
    decode_replicas: list[int] | None = None

    def replicas(self, role: str) -> list[int]:
        given = self.prefill_replicas if role == "prefill" else self.decode_replicas
        count = self.spec.workers.prefill if role == "prefill" else self.spec.workers.decode
        return list(range(count)) if given is None else given

    def cluster_entry(self, host: str, backend: str) -> dict:
        # Workers started with SGLang's --enable-priority-scheduling: the router sends `priority`.
        prio = bool(self.spec.server_args.get(backend, {}).get("enable_priority_scheduling"))
        return {
            "priority_scheduling": prio,
            "router_url": f"http://{host}:{self.router_port}",
            "prefill_urls": [f"http://{host}:{p}" for p in self.prefill_ports],
            "decode_urls": [f"http://{host}:{p}" for p in self.decode_ports],
            "bootstrap_ports": list(self.bootstrap_ports),
            "model_path": self.model_path,
            "tokenizer_path": self.tokenizer_path,
        }


def merge_models(configs: list[TopologyConfig]) -> dict[str, ModelSpec]:
    """The models of all configs; one name must mean one model everywhere, and each must be
    used by an agent (placement sizes a worker's pool by its agents)."""
    if unused := unused_models(configs):
        raise LaunchError(unused)
    models: dict[str, ModelSpec] = {}
    for cfg in configs:
        for name, spec in cfg.models.items():
            if name in models and models[name] != spec:
                raise LaunchError(
                    f"model '{name}' is defined differently in two configs ({cfg.name} and an "
                    "earlier one); give the two models different names"
                )
            models[name] = spec
    return models


def resolve_model(spec: ModelSpec, backend: str, local: bool = False) -> tuple[str, str]:
    """(model_path, tokenizer_path) as local paths, or a clear error before anything starts.
    `local`: resolve through the model store for SGLang too (its CPU path serves the CPU
    configs' models, named like "smollm2-135m"). A 'dummy:SHAPE' model is written by the model
    store for either backend: SGLang gets its local directory."""
    if backend == "torch" or local or spec.is_shape_only:
        from sglang_ext.engine.model_store import resolve_model_path

        try:
            path = resolve_model_path(spec.model_path)
        except (FileNotFoundError, ValueError) as e:
            raise LaunchError(str(e)) from None
        tokenizer = resolve_model_path(spec.tokenizer_path) if spec.tokenizer_path else path
        return path, tokenizer
    # SGLang resolves HF ids itself (from a local HF cache on GPU nodes); only check local paths.
    path = spec.model_path
    if path.startswith(("/", ".")) and not Path(path).exists():
        raise LaunchError(f"model path '{path}' does not exist; fix models.*.model_path")
    return path, spec.tokenizer_path or path
