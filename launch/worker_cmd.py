"""Command lines of one prefill or decode worker, for either backend, by SGLang's flag names."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from planning.types import WorkerPlacement
from router.config import ModelSpec


def server_arg_flags(args: dict[str, str | int | float | bool]) -> list[str]:
    """{"mem_fraction_static": 0.8, "enable_metrics": True} -> SGLang's dashed flags."""
    out: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is not False:
            out += [flag, str(value)]
    return out


def server_argv(
    backend: str,
    model_path: str,
    role: str,
    host: str,
    port: int,
    bootstrap_port: int | None = None,
    tokenizer_path: str | None = None,
    extra: Sequence[str] = (),
    patched: bool = True,
) -> list[str]:
    """One worker's command line: our launcher for either backend, or (patched=False, the
    negative control of the tests on real SGLang) SGLang's own `python -m sglang.launch_server`.
    role: "null" (a plain server), "prefill" or "decode" (PD over NIXL). The one place this
    command line is built; a GPU worker's device comes from placement_flags."""
    if backend == "sglang" and not patched:
        argv = [sys.executable, "-m", "sglang.launch_server"]
    else:
        argv = [sys.executable, "-m", "sglang_ext.launch_server", "--backend", backend]
    argv += ["--model-path", model_path]
    if tokenizer_path and tokenizer_path != model_path:
        argv += ["--tokenizer-path", tokenizer_path]
    argv += ["--disaggregation-mode", role]
    if role != "null":
        argv += ["--disaggregation-transfer-backend", "nixl"]
    argv += ["--host", host, "--port", str(port)]
    if bootstrap_port is not None:
        argv += ["--disaggregation-bootstrap-port", str(bootstrap_port)]
    return argv + list(extra)


def worker_argv(
    backend: str,
    model_path: str,
    spec: ModelSpec,
    role: str,
    host: str,
    port: int,
    bootstrap_port: int | None,
    tokenizer_path: str | None = None,
) -> list[str]:
    """A deployment's prefill or decode worker, with the config's load_format (SGLang's
    --load-format, which the reference engine honours too) and server_args for `backend`."""
    load = ["--load-format", spec.load_format] if spec.load_format != "auto" else []
    return server_argv(
        backend,
        model_path,
        role,
        host,
        port,
        bootstrap_port,
        tokenizer_path,
        load + server_arg_flags(spec.server_args.get(backend, {})),
    )


def router_argv(
    prefills: list[tuple[str, int | None]],
    decodes: list[str],
    host: str,
    port: int,
    metrics_host: str,
    metrics_port: int,
    extra: Sequence[str] = (),
    python: str = sys.executable,
) -> list[str]:
    """The real sglang-router in PD mode in front of `prefills` ((url, bootstrap port) each) and
    `decodes` (urls); its Prometheus endpoint on metrics_host:metrics_port (its default port
    clashes across routers). The one place this command line is built. It runs sglang-router's
    own launcher through launch.native_router, which keeps it from importing all of SGLang."""
    argv = [python, "-m", "launch.native_router", "--pd-disaggregation"]
    for url, bootstrap_port in prefills:
        argv += ["--prefill", url] + ([str(bootstrap_port)] if bootstrap_port is not None else [])
    for url in decodes:
        argv += ["--decode", url]
    return argv + [
        "--host",
        host,
        "--port",
        str(port),
        "--prometheus-host",
        metrics_host,
        "--prometheus-port",
        str(metrics_port),
        *extra,
    ]


def placement_flags(w: WorkerPlacement) -> tuple[list[str], dict[str, str]]:
    """SGLang flags and environment of a placed worker: its explicit pool (--max-total-tokens
    and the --mem-fraction-static computed for its turn), its GPU(s) and tensor parallelism; a
    plan's worker without GPUs (on CPU) gets its pool alone.
    Appended after the config's server_args, so they win (SGLang's argparse keeps the last)."""
    flags = ["--max-total-tokens", str(w.pool_tokens)]
    if w.mem_fraction_static is not None:
        flags += ["--mem-fraction-static", f"{w.mem_fraction_static:.3f}"]
    if w.demand.tp > 1:
        flags += ["--tp-size", str(w.demand.tp)]
    if not w.gpus:  # a plan's CPU worker: its pool only
        return flags, {}
    # Placement numbers GPUs as nvidia-smi does (PCI bus order, all of the node's); CUDA numbers
    # them fastest first and within the inherited CUDA_VISIBLE_DEVICES. So every placed worker
    # sees exactly its GPUs, in nvidia-smi's order, and its ranks start at the first of them.
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(map(str, w.gpus))}
    return flags + ["--base-gpu-id", "0"], env
