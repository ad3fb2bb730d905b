"""Which simulated workers exist, on which shared device, with which share of their model's
requests: from a DeploymentPlan, or the config's default deployment (`workers.prefill` +
`workers.decode` per model; on a CPU profile every worker shares the machine's cores, as
`moa-pd up` leaves them unpinned; on a GPU profile one GPU per worker)."""

from __future__ import annotations

from dataclasses import dataclass, field

from planning.devices import device_key, parse_device_key
from planning.plan_file import DeploymentPlan
from planning.pool_need import decode_running_requests, running_needs
from profiling.profile_file import Profile
from router.config import TopologyConfig

# The reference engine's defaults (sglang_ext/server_args.py) where a config sets none.
DEFAULT_MAX_PREFILL_TOKENS = 4096
DEFAULT_CHUNKED_PREFILL_SIZE = 2048
# What busy workers on a CPU cost each other beyond sharing its cores (simulation/device.py) where
# the profile did not measure it (`moa-pd profile --co-run`): none.
CPU_CO_RUN_SLOWDOWN = 0.0


@dataclass(frozen=True, slots=True)
class SimWorker:
    model: str
    role: str  # "prefill" | "decode"
    replica: int
    device: str
    share: float = 1.0

    @property
    def name(self) -> str:
        return f"{self.model}.{self.role}{self.replica}"


@dataclass(frozen=True, slots=True)
class SimDeployment:
    workers: tuple[SimWorker, ...]
    # device -> slots (cores on a CPU, 1 per GPU); a worker's `device` is one of these, or a TP
    # group "node:gpuI,J" of them (tp_members)
    devices: dict[str, int]
    gate_scope: str  # the router's warm-up gate: "device" (CPU default) or "worker" (GPUs)
    prefill_args: dict[str, tuple[int, int]]  # model -> (max_prefill_tokens, chunked size)
    description: str
    decode_slots: dict[str, int] = field(default_factory=dict)  # model -> max_running_requests
    co_run_slowdown: float = 0.0  # CPU devices: see simulation/device.py
    oversubscribed_slowdown: float = 0.0
    # The device gate weighs the decode slowdown it measures (cluster.json's
    # warmup_weigh_slowdown, the router's default); False: by slots alone (simulation/gate.py).
    gate_weighs_slowdown: bool = True


def merged_models(configs: list[TopologyConfig]) -> dict:
    models = {}
    for cfg in configs:
        for name, spec in cfg.models.items():
            models.setdefault(name, spec)
    return models


def _prefill_args(configs: list[TopologyConfig], backend: str) -> dict[str, tuple[int, int]]:
    out = {}
    for name, spec in merged_models(configs).items():
        args = spec.server_args.get(backend, {})
        out[name] = (
            int(args.get("max_prefill_tokens", DEFAULT_MAX_PREFILL_TOKENS)),
            int(args.get("chunked_prefill_size", DEFAULT_CHUNKED_PREFILL_SIZE)),
        )
    return out


def _decode_slots(configs: list[TopologyConfig], backend: str, concurrency: int) -> dict[str, int]:
    """Requests a model's decode worker admits at once (running + receiving KV); the rest wait
    before their prefill even starts (the prefill side waits for decode's bootstrap). As `moa-pd
    up` starts them (planning.pool_need.decode_running_requests); unbounded where the engine
    sizes its own from memory (real SGLang)."""
    needs = running_needs(configs, concurrency)
    out = {}
    for name, spec in merged_models(configs).items():
        n = decode_running_requests(spec.server_args, backend, needs.get(name, 0))
        out[name] = 1 << 20 if n is None else n
    return out


def _check_profiled(models, profile: Profile) -> None:
    missing = sorted(set(models) - set(profile.models))
    if missing:
        raise ValueError(
            f"the profile has no costs for model(s) {', '.join(missing)} (it has "
            f"{', '.join(sorted(profile.models))}); run `moa-pd profile` on these configs"
        )


def default_deployment(
    configs: list[TopologyConfig], profile: Profile, concurrency: int = 1
) -> SimDeployment:
    models = merged_models(configs)
    _check_profiled(models, profile)
    workers = []
    for name, spec in models.items():
        for role, count in (("prefill", spec.workers.prefill), ("decode", spec.workers.decode)):
            workers += [SimWorker(name, role, r, "", 1.0 / count) for r in range(count)]
    if profile.device.kind == "cpu":
        cores = profile.device.cores or profile.device.count
        workers = [SimWorker(w.model, w.role, w.replica, "cpu", w.share) for w in workers]
        devices, scope, where = {"cpu": cores}, "device", f"all workers on {cores} shared cores"
    else:
        workers = [
            SimWorker(w.model, w.role, w.replica, f"gpu{i}", w.share) for i, w in enumerate(workers)
        ]
        devices, scope, where = {w.device: 1 for w in workers}, "worker", "one GPU per worker"
    return _deployment(
        workers,
        devices,
        scope,
        configs,
        profile,
        f"config default: {len(workers)} workers, {where}",
        concurrency,
    )


def from_plan(
    plan: DeploymentPlan, configs: list[TopologyConfig], profile: Profile, concurrency: int = 1
) -> SimDeployment:
    _check_profiled({w.model for w in plan.workers}, profile)
    workers, devices = [], {}
    for w in plan.workers:
        if w.gpus:
            # Workers on the same GPU time-share it. A TP group computes on each of its GPUs
            # (simulation/device.py TPGroup): the GPUs are the devices, the group a key of them.
            dev = device_key(w.node, "gpu", w.gpus)
            devices.update({device_key(w.node, "gpu", [g]): 1 for g in w.gpus})
        else:
            if w.cpus:
                dev, slots = device_key(w.node, "cpu", w.cpus), len(w.cpus)
            else:
                dev, slots = device_key(w.node, "cpu"), profile.device.cores or profile.device.count
            devices[dev] = slots
        workers.append(SimWorker(w.model, w.role, w.replica, dev, w.share))
    roles = {(w.model, w.role) for w in workers}
    for name in merged_models(configs):
        for role in ("prefill", "decode"):
            if (name, role) not in roles:
                raise ValueError(
                    f"the plan has no {role} worker for model '{name}' of the configs; "
                    "plan again with these configs"
                )
    scope = "worker" if any(w.gpus for w in plan.workers) else "device"
    label = f"plan ({plan.mode}): {len(workers)} workers on {len(devices)} devices"
    return _deployment(workers, devices, scope, configs, profile, label, concurrency)


def _deployment(
    workers: list[SimWorker],
    devices: dict[str, int],
    scope: str,
    configs: list[TopologyConfig],
    profile: Profile,
    label: str,
    concurrency: int,
) -> SimDeployment:
    """The deployment with the configs' engine settings (as started for `concurrency` questions
    in flight) and the profile's device behaviour."""
    return SimDeployment(
        tuple(workers),
        devices,
        scope,
        _prefill_args(configs, profile.backend),
        label,
        _decode_slots(configs, profile.backend, concurrency),
        *_slowdowns(profile),
    )


def _slowdowns(profile: Profile) -> tuple[float, float]:
    """(co-run, oversubscribed) slowdowns of a CPU profile's device: measured, or assumed."""
    dev = profile.device
    if dev.kind != "cpu":
        return 0.0, 0.0
    co = dev.co_run_slowdown if dev.co_run_slowdown is not None else CPU_CO_RUN_SLOWDOWN
    return co, dev.oversubscribed_slowdown or 0.0


def is_gpu(device: str) -> bool:
    """Whether a device key names GPUs (its kind, not a substring: a node may be called
    "gpu-node-1" and still hold cores)."""
    return parse_device_key(device)[1] == "gpu"


def tp_members(device: str) -> list[str]:
    """The GPUs of a TP group's key ("node:gpu0,1" -> ["node:gpu0", "node:gpu1"]); [] for a
    device of its own."""
    node, kind, ids = parse_device_key(device)
    if kind != "gpu" or len(ids) < 2:
        return []
    return [device_key(node, "gpu", [i]) for i in ids]
