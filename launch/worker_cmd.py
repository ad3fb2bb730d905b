"""Command lines of one prefill or decode worker, for either backend, by SGLang's flag names."""

from __future__ import annotations

import sys
from collections.abc import Sequence

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


def worker_argv(backend: str, model_path: str, spec: ModelSpec, role: str, host: str, port: int,
                bootstrap_port: int | None, tokenizer_path: str | None = None,
                gpu_id: int | None = None) -> list[str]:
    argv = [sys.executable, "-m", "sglang_ext.launch_server", "--backend", backend,
            "--model-path", model_path]
    if tokenizer_path and tokenizer_path != model_path:
        argv += ["--tokenizer-path", tokenizer_path]
    argv += ["--disaggregation-mode", role, "--disaggregation-transfer-backend", "nixl",
             "--host", host, "--port", str(port)]
    if bootstrap_port is not None:
        argv += ["--disaggregation-bootstrap-port", str(bootstrap_port)]
    if gpu_id is not None:
        argv += ["--base-gpu-id", str(gpu_id)]
    argv += server_arg_flags(spec.server_args.get(backend, {}))
    return argv


def router_argv(prefills: list[tuple[str, int | None]], decodes: list[str], host: str, port: int,
                metrics_host: str, metrics_port: int, extra: Sequence[str] = (),
                python: str = sys.executable) -> list[str]:
    """The real sglang-router in PD mode in front of `prefills` ((url, bootstrap port) each) and
    `decodes` (urls); its Prometheus endpoint on metrics_host:metrics_port (its default port
    clashes across routers). The one place this command line is built."""
    argv = [python, "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    for url, bootstrap_port in prefills:
        argv += ["--prefill", url] + ([str(bootstrap_port)] if bootstrap_port is not None else [])
    for url in decodes:
        argv += ["--decode", url]
    return argv + ["--host", host, "--port", str(port), "--prometheus-host", metrics_host,
                   "--prometheus-port", str(metrics_port), *extra]
