"""Placement by memory: workers onto GPUs, first-fit decreasing (`pack`) or each on GPUs of its
own (`one-per-worker`), with a start turn and SGLang's --mem-fraction-static for each worker; and
onto CPU cores (`plan_cpus`: `--pin-cpus`, and the greedy baseline of a CPU plan)."""

from __future__ import annotations

import math
import os
from dataclasses import replace

from planning.types import GPU, MIB, Placement, Policy, WorkerDemand, WorkerPlacement

# Per GPU and worker (each TP rank), memory beyond weights and KV pool: the CUDA context
# (~0.5 GiB), CUDA graphs, a prefill chunk's activations (~1 GiB for a 32B model at 8k tokens),
# NCCL buffers under TP, allocator slack. An estimate, not a measurement (`--gpu-headroom-mib`
# changes it): SGLang's own default fraction leaves more on an 80 GB card, sized for CUDA graphs
# of batches far larger than a MoA deployment runs. A pool that comes up short fails the start
# (launch.pool_check); an out-of-memory while capturing CUDA graphs shows in the worker's log.
HEADROOM_MIB = 6144
# SGLang measures "free at start" after its own CUDA context (and NCCL, under TP) exists.
CUDA_CONTEXT_MIB = 768
# What loading adds beyond the weights (temporary buffers, RoPE caches, cuBLAS workspaces) that
# SGLang sees as used when it measures free memory after loading; part of the static fraction.
LOAD_SLACK_MIB = 1024
# The least headroom a plan may reserve: mem_fraction_static takes the CUDA context and the
# loading slack out of it, so a smaller one gives SGLang a fraction of 1 or more (refused).
MIN_HEADROOM_MIB = CUDA_CONTEXT_MIB + LOAD_SLACK_MIB


class PlanError(ValueError):
    """A plan that cannot be made: a deployment that does not fit (the message names model, GPU,
    need and free), or planning input that is wrong (GPUs, models, flags: it names the fix)."""


def check_headroom(headroom_mib: int) -> None:
    """PlanError unless the headroom covers what mem_fraction_static takes out of it."""
    if headroom_mib < MIN_HEADROOM_MIB:
        raise PlanError(
            f"--gpu-headroom-mib {headroom_mib} is below the minimum {MIN_HEADROOM_MIB}: each "
            f"worker's CUDA context ({CUDA_CONTEXT_MIB} MiB) and what loading allocates "
            f"({LOAD_SLACK_MIB} MiB) come out of it; give --gpu-headroom-mib {MIN_HEADROOM_MIB} "
            f"or more (default {HEADROOM_MIB})"
        )


def choose_tp(d: WorkerDemand, gpus: list[GPU], headroom_mib: int = HEADROOM_MIB) -> int:
    """The smallest power of two of GPUs whose per-GPU share of weights and pool fits the GPU
    with the most free memory; refuses when even all GPUs would not hold it."""
    largest = max(gpus, key=lambda g: g.free_mib)
    tp = 1
    while tp <= len(gpus):
        share = replace(d, tp=tp).bytes_per_gpu(d.pool_tokens, headroom_mib * MIB)
        if share <= largest.free_mib * MIB:
            return tp
        tp *= 2
    raise PlanError(
        f"model '{d.model}' does not fit: weights {d.weights_bytes / MIB:,.0f} MiB + KV pool "
        f"{d.pool_tokens:,} tokens ({d.pool_tokens * d.kv_bytes_per_token / MIB:,.0f} MiB) "
        f"need more than the {len(gpus)} GPU(s) given; the largest, GPU {largest.index} "
        f"({largest.name}), has {largest.free_mib:,} MiB free. Use more GPUs or smaller models"
    )


def place(
    demands: list[WorkerDemand],
    gpus: list[GPU],
    policy: Policy = "pack",
    concurrency: int = 1,
    headroom_mib: int = HEADROOM_MIB,
) -> Placement:
    """Each demand (with its tp set) onto tp GPUs, or PlanError before anything starts."""
    check_headroom(headroom_mib)
    if not gpus:
        raise PlanError("no GPU to place workers on; check --gpus and nvidia-smi")
    headroom = headroom_mib * MIB
    left = {g.index: g.free_mib * MIB for g in gpus}
    count = {g.index: 0 for g in gpus}
    # Bins in order of free memory: the roomiest GPUs fill first.
    order = sorted(gpus, key=lambda g: (-g.free_mib, g.index))
    placed: list[tuple[WorkerDemand, tuple[int, ...], int]] = []
    for d in sorted(demands, key=lambda d: -d.bytes_per_gpu(d.pool_tokens, 0) * d.tp):
        need = d.bytes_per_gpu(d.pool_tokens, headroom)
        fits = [
            g.index
            for g in order
            if left[g.index] >= need and (policy == "pack" or count[g.index] == 0)
        ]
        if len(fits) < d.tp:
            roomiest = max(order, key=lambda g: left[g.index])
            raise PlanError(_refusal(d, need, roomiest, left[roomiest.index], count, policy))
        chosen = tuple(sorted(fits[: d.tp]))
        pool = d.pool_tokens
        if policy == "one-per-worker":
            # Alone on its GPUs: the pool takes what weights and headroom leave (more cache).
            room = min(left[i] for i in chosen) - need
            pool += room * d.tp // d.kv_bytes_per_token
        for i in chosen:
            left[i] -= d.bytes_per_gpu(pool, headroom)
            count[i] += 1
        placed.append((d, chosen, pool))
    return assign_turns(placed, gpus, policy, concurrency, headroom_mib)


def assign_turns(
    placed: list[tuple[WorkerDemand, tuple[int, ...], int]],
    gpus: list[GPU],
    policy: Policy = "pack",
    concurrency: int = 1,
    headroom_mib: int = HEADROOM_MIB,
) -> Placement:
    """The start turn and --mem-fraction-static of each placed (demand, GPUs, pool), in order:
    a worker starts after every earlier worker on any of its GPUs is healthy, so each sees the
    memory they left and sizes its pool from that (SGLang sizes it at its start)."""
    headroom = headroom_mib * MIB
    by_index = {g.index: g for g in gpus}
    plan = Placement(policy, concurrency, list(gpus), headroom_mib)
    used: dict[int, int] = {g.index: 0 for g in gpus}
    depth: dict[int, int] = {g.index: 0 for g in gpus}
    for d, chosen, pool in placed:
        turn = max(depth[i] for i in chosen)
        free_at_turn = min(by_index[i].free_mib * MIB - used[i] for i in chosen)
        fraction = mem_fraction_static(d, pool, free_at_turn)
        if fraction >= 1:  # SGLang refuses it; only a headroom near the minimum comes here
            raise PlanError(
                f"{d.name} on GPU {','.join(map(str, chosen))}: its weights and KV pool leave "
                f"no room for the CUDA context and loading (--mem-fraction-static "
                f"{fraction:.3f} >= 1); raise --gpu-headroom-mib (now {headroom_mib})"
            )
        plan.workers.append(WorkerPlacement(d, chosen, pool, turn, fraction))
        for i in chosen:
            used[i] += d.bytes_per_gpu(pool, headroom)
            depth[i] = turn + 1
    return plan


def mem_fraction_static(d: WorkerDemand, pool_tokens: int, free_at_start: int) -> float:
    """SGLang's --mem-fraction-static for a worker that sees free_at_start bytes free.

    SGLang (model_runner.py's profile_max_num_token in 0.5.x; profile_available_bytes in later
    sources, the same formula) gives the pool
    rest = free_after_loading - free_at_start * (1 - fraction) bytes, i.e.
    free_at_start * fraction - weights - what loading allocated; --max-total-tokens then caps it.
    So this fraction, with LOAD_SLACK for the loading, leaves room for exactly the planned pool
    (rounded up to 0.001); the rest is activation space and the next turns' memory."""
    static = d.bytes_per_gpu(pool_tokens, LOAD_SLACK_MIB * MIB)
    return math.ceil(1000 * static / (free_at_start - CUDA_CONTEXT_MIB * MIB)) / 1000


def _refusal(
    d: WorkerDemand, need: int, roomiest: GPU, left: int, count: dict[int, int], policy: Policy
) -> str:
    headroom = need - d.bytes_per_gpu(d.pool_tokens, 0)
    per = f" per GPU on each of {d.tp} GPUs (tensor parallel)" if d.tp > 1 else ""
    where = f"GPU {roomiest.index} ({roomiest.name}), the roomiest left, has"
    fix = "Give more GPUs (--gpus), lower --concurrency, or lower the agents' max_new_tokens"
    if policy == "one-per-worker" and count[roomiest.index]:
        where = "every GPU already holds a worker (policy one-per-worker); the roomiest has"
        fix = "Give more GPUs (--gpus) or let workers share GPUs (--gpu-policy pack)"
    return (
        f"the plan does not fit: model '{d.model}' ({d.name}) needs {need / MIB:,.0f} MiB{per} "
        f"(weights {d.weights_bytes / d.tp / MIB:,.0f} + KV pool {d.pool_tokens:,} tokens = "
        f"{d.pool_tokens * d.kv_bytes_per_token / d.tp / MIB:,.0f} + headroom "
        f"{headroom / MIB:,.0f}), but {where} {left / MIB:,.0f} MiB free of "
        f"{roomiest.total_mib:,} MiB. {fix}"
    )


def plan_cpus(roles: list[str], cores: list[int] | None = None) -> list[list[int]]:
    """Cores for workers of the given roles ("prefill"/"decode"), as separate GPUs would keep
    them: prefill workers take cores from the front, decode workers from the back, each its own
    core while there are enough, else sharing round-robin. The rest of the deployment (routers)
    is not pinned."""
    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    prefill = [i for i, r in enumerate(roles) if r == "prefill"]
    decode = [i for i, r in enumerate(roles) if r != "prefill"]
    out: list[list[int]] = [[] for _ in roles]
    for k, i in enumerate(prefill):
        out[i] = [cores[k % len(cores)]]
    for k, i in enumerate(decode):
        out[i] = [cores[-1 - k % len(cores)]]
    return out
