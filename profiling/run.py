"""A whole `moa-pd profile` run: bring the config's deployment up (or use a running one), measure
each chosen model in turn while the others idle, and assemble the Profile."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from planning.model_memory import model_memory
from planning.pool_need import decode_running_requests, pool_needs, running_needs
from profiling.knobs import Knobs
from profiling.machine import device_info, host, now_utc, versions
from profiling.measure import LOW_TOKEN_ID, ModelProber, ModelRun, ProfileError, model_vocab
from profiling.profile_file import ModelProfile, Profile
from router.cluster import ClusterSpec
from router.config import TopologyConfig

Tick = Callable[[str, str], None]  # (model, what was just measured)


@dataclass(frozen=True, slots=True)
class Target:
    """What to profile: the config, the models chosen from it, the backend and the device."""

    config: TopologyConfig
    models: list[str]
    backend: str
    cuda: bool  # real SGLang on NVIDIA GPUs (else the CPU: the reference engine or SGLang's)
    knobs: Knobs
    seed: int = 0


def choose_models(config: TopologyConfig, wanted: list[str] | None) -> list[str]:
    """The config's models, or the listed ones; ProfileError names an unknown one."""
    if not wanted:
        return list(config.models)
    unknown = [m for m in wanted if m not in config.models]
    if unknown:
        raise ProfileError(
            f"--models names {', '.join(repr(m) for m in unknown)}, which config "
            f"{config.name} does not define; its models: {', '.join(config.models)}"
        )
    return list(dict.fromkeys(wanted))


def decode_pool_tokens(knobs: Knobs) -> int:
    """KV tokens a decode worker must hold for the largest decode point: every stream's prompt
    and its output (SHORT_RUN + decode_tokens), with room to spare."""
    return max(knobs.decode_batches) * (max(knobs.decode_contexts) + 2 * knobs.decode_tokens)


def pool_concurrency(
    config: TopologyConfig,
    models: list[str],
    tokens: int,
    streams: int = 1,
    backend: str = "torch",
) -> int:
    """The smallest `--concurrency` whose KV pools (planning.pool_need, which the launcher and
    the GPU placement size them by) hold `tokens` on each profiled model's decode worker, and
    whose decode workers admit `streams` requests at once (the largest decode batch: a worker
    that admitted fewer would time two waves of steps as one; `moa-pd up --concurrency` starts
    them with planning.pool_need's running requests)."""
    for m in models:
        # Asked for `streams`, the rule answers less only where the config fixes the number.
        fixed = decode_running_requests(config.models[m].server_args, backend, streams)
        if fixed is not None and fixed < streams:
            raise ProfileError(
                f"config {config.name}: models.{m}.server_args.{backend}.max_running_requests "
                f"is {fixed}, below the largest decode batch to measure ({streams}): lower "
                "--decode-batches or raise it"
            )

    def enough(c: int) -> bool:
        needs = pool_needs([config], c)
        running = running_needs([config], c)

        def admits(m: str) -> bool:
            n = decode_running_requests(config.models[m].server_args, backend, running.get(m, 0))
            return n is None or n >= streams  # None: the engine sizes it from memory

        return all(needs.get((m, "decode"), 0) >= tokens and admits(m) for m in models)

    hi = 1
    while not enough(hi):
        hi *= 2
    lo = hi // 2 + 1 if hi > 1 else 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid + 1, hi)
    return hi


def prompt_vocab(model_path: str, tokenizer_path: str) -> int:
    """Random prompt ids stay below both the model's vocabulary and its tokenizer's (a shape-only
    model pairs a 151k-row embedding with SmolLM2's 49k tokenizer)."""
    try:
        vocab = model_vocab(model_path, tokenizer_path)
    except ValueError as e:
        raise ProfileError(str(e)) from None
    if vocab <= LOW_TOKEN_ID:
        raise ProfileError(f"model {model_path}: vocabulary of {vocab} is too small for prompts")
    return vocab


def check_served(cluster: ClusterSpec, models: list[str]) -> None:
    """ProfileError naming a chosen model the running deployment does not serve."""
    for m in models:
        if m not in cluster.models:
            raise ProfileError(
                f"the running deployment serves no model '{m}' (it serves "
                f"{', '.join(cluster.models)}); start it from this config or fix --models"
            )


async def measure_models(cluster: ClusterSpec, target: Target, tick: Tick) -> dict[str, ModelRun]:
    """Each model in turn on the deployment `cluster` describes."""
    from router.context import RouterContext

    check_served(cluster, target.models)
    runs = {}
    rng = random.Random(target.seed)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:
        ctx = RouterContext(cluster, session, seed=target.seed)
        for m in target.models:
            spec = cluster.models[m]
            vocab = prompt_vocab(spec.model_path, spec.tokenizer_path or spec.model_path)
            prober = ModelProber(
                ctx.deployments[m],
                vocab,
                target.knobs,
                random.Random(rng.random()),
                lambda what, m=m: tick(m, what),
            )
            runs[m] = await prober.measure()
    return runs


def memory_dtype(target: Target, model: str) -> str:
    """The dtype its workers serve in: the config's server_args, else the backend's default
    (the reference engine and SGLang's CPU path float32; SGLang on a GPU the model's own)."""
    args = target.config.models[model].server_args.get(target.backend, {})  # type: ignore[call-overload]
    if "dtype" in args:
        return str(args["dtype"])
    return "auto" if target.cuda else "float32"


def model_profile(target: Target, model: str, run: ModelRun, served_path: str) -> ModelProfile:
    mem = model_memory(served_path, memory_dtype(target, model))
    source = (
        "the prefill worker's own span (meta_info forward_entry_time -> prefill_finished_time)"
        if run.uses_worker_span
        else "the HTTP round trip of the warm-up (the worker reported no forward span)"
    )
    notes = (
        f"measured: prefill = median of {target.knobs.reps} of {source} of the prefill-only "
        "warm-up verb on an idle prefill worker (cold: fresh random ids; cached: a fresh prefix "
        "warmed first); decode = B streams over the PD path as the shell router sends them (ignore_eos, prompts cached "
        "on prefill first) run twice, to 4 and to 4 + decode_tokens new tokens: the difference "
        "of the median finish times per extra token; pd_fixed = median of TTFT "
        "over the same path minus the cold prefill at the same length, pd = the same per "
        "length (fitted as a fixed part + KV bytes / bandwidth). derived: "
        f"weights_bytes and kv_bytes_per_token from config.json ({mem.dtype}, KV {mem.kv_dtype}; "
        "planning/model_memory.py)."
    )
    return ModelProfile(
        model_path=target.config.models[model].model_path,
        weights_bytes=mem.weights_bytes,
        kv_bytes_per_token=mem.kv_bytes_per_token,
        prefill=run.prefill_points(),
        decode=run.decode,
        pd_fixed_seconds=run.pd_fixed_seconds(),
        pd=run.pd_points(),
        notes=notes,
    )


def build_profile(target: Target, runs: dict[str, ModelRun], cluster: ClusterSpec) -> Profile:
    return Profile(
        device=device_info(target.cuda),
        backend=target.backend,  # type: ignore[arg-type]
        versions=versions(),
        created=now_utc(),
        host=host(),
        models={
            m: model_profile(target, m, run, cluster.models[m].model_path)
            for m, run in runs.items()
        },
    )


def profile_cluster(cluster: ClusterSpec, target: Target, tick: Tick) -> Profile:
    """Profile the models of a running deployment (its cluster.json, loaded)."""
    runs = asyncio.run(measure_models(cluster, target, tick))
    return build_profile(target, runs, cluster)
