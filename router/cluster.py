"""The cluster file the launcher writes: where each model's PD deployment listens, plus the shell
router's timeouts. Read by `python -m router` and by tests that build a router by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import psutil
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ClusterError(ValueError):
    """A cluster file that cannot be used, with what to fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Timeouts(_Strict):
    """Seconds. Every wait in the router has one, so a dead or hanging worker becomes an error."""

    connect_s: float = Field(default=5.0, gt=0)
    # Longest silence inside a streamed reply (first token included) before the worker counts
    # as hanging.
    read_s: float = Field(default=300.0, gt=0)
    warmup_s: float = Field(default=120.0, gt=0)
    # How long a successor waits for a precursor's next token (a precursor that never starts, or
    # a driver that never sends it, fails the successor instead of hanging it).
    precursor_wait_s: float = Field(default=1800.0, gt=0)
    abort_s: float = Field(default=5.0, gt=0)
    # A worker's /health must answer within this; two misses in a row and it counts as hung.
    # The reference engine answers from its HTTP loop at once. SGLang's /health runs a one-token
    # generation behind the running batch (>= 1 s, seconds behind a long CPU prefill), so the
    # launcher writes SGLANG_HEALTH_PROBE_S for SGLang workers (launch/stack.py).
    health_probe_s: float = Field(default=2.5, gt=0)
    # A per-agent session stays this long after its last request, for agents that arrive late.
    session_linger_s: float = Field(default=30.0, ge=0)


class _Tolerant(BaseModel):
    # The launcher writes this file and may add keys of its own (backend, host, configs, ...).
    model_config = ConfigDict(extra="ignore", frozen=True)


def create_time(pid: int) -> float | None:
    """When pid started (psutil's create_time), or None when it is gone or a zombie.

    Together with the pid this names one process for good: a reused pid has another start time,
    and, unlike the command line, it does not change when a program renames itself (the Rust
    sglang-router shows up as `sglang::router`). The launcher records it, the router compares it.
    """
    try:
        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc.create_time()
    except psutil.Error:
        return None


class ProcessInfo(_Tolerant):
    """A process the launcher started, so the router can tell a user which one died and where
    its log is (and notice an exit without waiting for a timeout)."""

    name: str
    pid: int | None = None
    create_time: float | None = None  # with the pid, names the process for good (pids are reused)
    log: str | None = None


class ModelDeployment(_Tolerant):
    """One model's PD deployment: a native sglang-router in front of prefill and decode workers."""

    router_url: str
    prefill_urls: list[str] = Field(min_length=1)
    decode_urls: list[str] = Field(min_length=1)
    # One per prefill worker; None where the worker has no bootstrap server.
    bootstrap_ports: list[int | None] = []
    model_path: str = ""
    tokenizer_path: str
    # Data-parallel ranks per prefill worker (SGLang picks the rank as bootstrap_room % dp_size).
    prefill_dp_size: int = Field(default=1, ge=1)
    # The launcher sets it when the workers run with --enable-priority-scheduling.
    priority_scheduling: bool = False
    # By URL (a worker's or the native router's): what the launcher knows of its process.
    processes: dict[str, ProcessInfo] = {}
    # The compute device (a key of ClusterSpec.devices) each worker runs on, one per URL; empty
    # when unknown (then a worker shares nothing as far as the warm-up gate knows).
    prefill_devices: list[str] = []
    decode_devices: list[str] = []
    # The model's context length in tokens. None: the shell router asks a prefill worker at
    # start (`/v1/models`' max_model_len, SGLang's own figure, --context-length included).
    context_len: int | None = Field(default=None, gt=0)
    # A plan's request split (launch/plan_deploy.py): the fraction of the model's requests each
    # worker gets, one per URL. Empty: none planned (the shell router balances by load).
    prefill_shares: list[float] = []
    decode_shares: list[float] = []

    @model_validator(mode="after")
    def _ports_match(self) -> ModelDeployment:
        for key, urls in (
            ("bootstrap_ports", self.prefill_urls),
            ("prefill_devices", self.prefill_urls),
            ("decode_devices", self.decode_urls),
            ("prefill_shares", self.prefill_urls),
            ("decode_shares", self.decode_urls),
        ):
            given = getattr(self, key)
            if given and len(given) != len(urls):
                raise ValueError(
                    f"{len(given)} {key} for {len(urls)} workers; give one per worker "
                    "(in the order of the URLs) or none"
                )
        for key in ("prefill_shares", "decode_shares"):
            shares = getattr(self, key)
            if shares and (min(shares) <= 0 or abs(sum(shares) - 1) > 1e-3):
                raise ValueError(f"{key} {shares}: give positive fractions that sum to 1")
        return self

    def bootstrap_port(self, index: int) -> int | None:
        return self.bootstrap_ports[index] if self.bootstrap_ports else None


class ClusterSpec(_Tolerant):
    models: dict[str, ModelDeployment]
    shell_router_url: str | None = None
    # Where `moa-pd up --api-key` wrote the key (mode 0600); never the key itself.
    api_key_file: str | None = None
    timeouts: Timeouts = Timeouts()
    # How warm-ups reach a prefill worker: SGLang's own /generate with the fake bootstrap host
    # (works on unpatched SGLang <= 0.5.10), or our /prefill_only verb.
    warmup_verb: Literal["generate", "prefill_only"] = "generate"
    # The questions in flight `moa-pd up --concurrency` sized its KV pools and decode running
    # requests for (None: a cluster.json written before it was recorded).
    concurrency: int | None = None
    # Whether the router sends SGLang's `priority` field (critical above warm-ups), a second line
    # behind its own PrefillGate. None: per model, as its workers were started (a model's
    # `priority_scheduling`, from --enable-priority-scheduling); True/False overrides that
    # (benchmarks compare the two on the same workers).
    priority_scheduling: bool | None = None
    # The order of requests within each class (critical, warm-up), at the workers (the priority
    # field above) and at the warm-up gates: False, first come first served; True, workflow
    # priority, the requests of the question that arrived first go first (router/priority.py).
    workflow_priority: bool = False
    # The order a question's agents start in, which is the order their prefill workers queue
    # the first layer's prompts: "config", the config's order; "critical_path", the longest
    # remaining decode path first (router/priority.py). Not the default: on a CPU it moved
    # pipelined end to end by 0.96x at concurrency 1 and 1.08x at 4 (docs/benchmarks.md, stop
    # 44). Early exit and aggregator bypass keep the config's order either way.
    start_order: Literal["critical_path", "config"] = "config"
    # The router's own isolation of warm-ups (router/prefill_gate.py); off only to measure what
    # it buys (benchmarks/bench_gate_ladder.py).
    warmup_gate: bool = True
    # Compute devices the workers share, by name: how many busy workers each runs at full speed
    # (its cores on a CPU, 1 on a GPU). With `warmup_gate_scope` "device" a warm-up also waits
    # until its prefill worker fits beside the device's busy workers (router/compute_device.py);
    # "worker" looks at the prefill worker alone (the gate before issue 19).
    devices: dict[str, int] = {}
    warmup_gate_scope: Literal["worker", "device"] = "device"
    # With scope "device": also admit a warm-up only if it pays for the decodes it slows there,
    # as the router measures them (router/compute_device.py); False, by slots alone (the gate
    # before issue 28: benchmarks compare the two).
    warmup_weigh_slowdown: bool = True
    # How sure the router must be that a warm-up does not pay before it refuses one: it weighs
    # the measured slowdown's one-sided confidence bound at this level (0.95: refuse only when
    # sure; 0.05: admit only when sure it pays; 0.5, the default: the estimate itself).
    warmup_slowdown_confidence: float = Field(0.5, gt=0.0, lt=1.0)

    @model_validator(mode="after")
    def _devices_known(self) -> ClusterSpec:
        for name, m in self.models.items():
            unknown = sorted(set(m.prefill_devices + m.decode_devices) - set(self.devices))
            if unknown:
                raise ValueError(
                    f"models.{name} names device(s) {', '.join(unknown)} that `devices` does "
                    "not list; add them with their slot counts"
                )
        bad = sorted(d for d, slots in self.devices.items() if slots < 1)
        if bad:
            raise ValueError(f"devices {', '.join(bad)}: slots must be at least 1")
        return self

    def sends_priority(self, model: str) -> bool:
        if self.priority_scheduling is not None:
            return self.priority_scheduling
        return self.models[model].priority_scheduling


def load_cluster(path: str | Path) -> ClusterSpec:
    """Read and validate a cluster file; ClusterError says what is wrong."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except FileNotFoundError as e:
        raise ClusterError(
            f"cluster file {p} does not exist; start the stack with `moa-pd up`"
        ) from e
    except json.JSONDecodeError as e:
        raise ClusterError(f"cluster file {p} is not JSON: {e}") from e
    try:
        return ClusterSpec.model_validate(raw)
    except ValidationError as e:
        raise ClusterError(f"cluster file {p} is invalid: {e}") from e
