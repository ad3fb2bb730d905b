"""`ModelPlan`: one model of a deployment as the launcher starts it, the endpoints of its PD
workers and native router (launch/stack.py). The models themselves, merged from the configs and
resolved to local paths, come from planning.models."""

from __future__ import annotations

from dataclasses import dataclass, field

from router.config import ModelSpec


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
