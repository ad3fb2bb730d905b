"""Real SGLang on SGLang's own CPU path (no GPU): the flags and environment each worker needs.

Tested with SGLang 0.5.23 and torch 2.13.0+cpu (`make test-sglang`, docs in the README). Each
entry says why it is there; `worker_flags(role)` and `worker_env(role)` are what `moa-pd up` and
the tests add to a worker's command line on a machine without a GPU.
"""

from __future__ import annotations

# Every worker. SGLang's CPU engine (SGLANG_USE_CPU_ENGINE=1) with torch-native attention and
# sampling; no CUDA graphs; no server warm-up request (it would only cost start time);
# float32 as the reference engine and transformers compute, so greedy ids compare exactly;
# a small KV pool: the CPU engine sizes it from host memory otherwise. --sleep-on-idle: an idle
# scheduler otherwise busy-polls its sockets and spins a whole core (measured: 1.01 cores), so a
# PD pair on a 2-core machine would take both cores while doing nothing; it sleeps only when
# fully idle (no queued request, no KV transfer in flight) and wakes on the next request.
POOL_TOKENS = 4096  # KV pool per worker unless a config needs more (launch.stack)
# fmt: off
COMMON_FLAGS: tuple[str, ...] = (
    "--device", "cpu",
    "--sleep-on-idle",
    "--attention-backend", "torch_native",
    "--sampling-backend", "pytorch",
    "--skip-server-warmup",
    "--disable-cuda-graph",
    "--dtype", "float32",
    "--max-total-tokens", str(POOL_TOKENS),
)
# fmt: on
# Decode: the default retraction backup ("host_pool") pins a host KV pool with
# cudaHostRegister, which a CPU torch cannot do.
DECODE_FLAGS: tuple[str, ...] = ("--disaggregation-decode-retraction-backup", "none")

COMMON_ENV: dict[str, str] = {"SGLANG_USE_CPU_ENGINE": "1"}
# Prefill: the early send of a radix-cached prefix under the overlap scheduler creates a
# torch.cuda.Event (disaggregation/prefill.py, maybe_send_cached_prefix_chunk) and kills the
# scheduler on the first request that hits a cached prefix -- exactly the warm-up-hit path.
# Turning that early send off keeps the overlap scheduler (the narrowest fix; the other one,
# --disable-overlap-schedule, also works but slows every batch).
PREFILL_ENV: dict[str, str] = {"SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX": "0"}


def worker_flags(role: str) -> list[str]:
    """The CPU flags of a worker in `role` ("null", "prefill" or "decode")."""
    return [*COMMON_FLAGS, *(DECODE_FLAGS if role == "decode" else ())]


def worker_env(role: str) -> dict[str, str]:
    """The CPU environment of a worker in `role` (the NIXL DRAM relabel keys on it too)."""
    return {**COMMON_ENV, **(PREFILL_ENV if role == "prefill" else {})}
