"""One PD pair on real SGLang as data: its spec and the exact command lines of its three processes.

Pure (no SGLang import), so CPU tests and `--dry-run` see what would run; `__main__.py` runs them through launch.procs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from launch.worker_cmd import router_argv
from sglang_ext import protocol as P

ROLES = ("prefill", "decode", "router")


@dataclass(frozen=True, slots=True)
class PDPairSpec:
    """A prefill worker, a decode worker and the sglang-router in front of them, on one host."""

    model_path: str
    host: str = "127.0.0.1"
    prefill_port: int = 30000
    decode_port: int = 30001
    router_port: int = 8000
    # The router's Prometheus port; its default clashes across pairs.
    router_metrics_port: int = 29000
    bootstrap_port: int = P.DEFAULT_BOOTSTRAP_PORT
    transfer_backend: str = "nixl"
    ib_device: str | None = None  # e.g. "mlx5_0" or "mlx5_0,mlx5_1"; None lets UCX choose
    prefill_gpu: int = 0  # --base-gpu-id of each worker; equal values share one GPU
    decode_gpu: int = 1
    tp_size: int = 1
    mem_fraction_static: float | None = None
    schedule_conservativeness: float | None = None
    load_format: str | None = None  # "dummy": random weights of the real architecture
    skip_tokenizer_init: bool = False  # prompts as input_ids; no tokenizer files needed
    prefill_args: tuple[str, ...] = ()  # extra SGLang flags, passed through verbatim
    decode_args: tuple[str, ...] = ()
    router_args: tuple[str, ...] = ()
    python: str = field(default_factory=lambda: sys.executable)

    def __post_init__(self) -> None:
        ports = [
            self.prefill_port,
            self.decode_port,
            self.router_port,
            self.router_metrics_port,
            self.bootstrap_port,
        ]
        if any(not 0 < p < 65536 for p in ports) or len(set(ports)) != len(ports):
            raise ValueError(
                f"PD pair ports must be distinct and in 1..65535, got prefill={self.prefill_port} "
                f"decode={self.decode_port} router={self.router_port} "
                f"router_metrics={self.router_metrics_port} bootstrap={self.bootstrap_port}"
            )
        if self.transfer_backend == "fake":
            raise ValueError(
                "transfer backend 'fake' cannot serve a prefill worker (SGLang "
                "0.5.10+ refuses it); use 'nixl' or 'mooncake'"
            )
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static < 1:
            raise ValueError(
                f"mem_fraction_static must be in (0, 1), got "
                f"{self.mem_fraction_static}; two workers on one GPU need <= 0.45"
            )
        if min(self.prefill_gpu, self.decode_gpu) < 0 or self.tp_size < 1:
            raise ValueError("GPU ids must be >= 0 and tp_size >= 1")

    @property
    def url_host(self) -> str:
        # A server bound to every interface is still reached through loopback on this host.
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host

    def url(self, role: str) -> str:
        port = {
            "prefill": self.prefill_port,
            "decode": self.decode_port,
            "router": self.router_port,
        }[role]
        return f"http://{self.url_host}:{port}"


def worker_command(spec: PDPairSpec, role: str) -> list[str]:
    """`python -m sglang_ext.launch_server --backend sglang ...` for the prefill or decode worker."""
    if role not in ("prefill", "decode"):
        raise ValueError(f"worker role must be 'prefill' or 'decode', got {role!r}")
    prefill = role == "prefill"
    # One flag and its value per line:
    # fmt: off
    cmd = [
        spec.python, "-m", "sglang_ext.launch_server", "--backend", "sglang",
        "--model-path", spec.model_path,
        "--host", spec.host,
        "--port", str(spec.prefill_port if prefill else spec.decode_port),
        "--disaggregation-mode", role,
        "--disaggregation-transfer-backend", spec.transfer_backend,
        # On decode this is the prefill port assumed for requests with bootstrap_port null.
        "--disaggregation-bootstrap-port", str(spec.bootstrap_port),
        "--base-gpu-id", str(spec.prefill_gpu if prefill else spec.decode_gpu),
        "--tp-size", str(spec.tp_size),
    ]
    # fmt: on
    if spec.ib_device:
        cmd += ["--disaggregation-ib-device", spec.ib_device]
    if spec.mem_fraction_static is not None:
        cmd += ["--mem-fraction-static", str(spec.mem_fraction_static)]
    if spec.schedule_conservativeness is not None:
        cmd += ["--schedule-conservativeness", str(spec.schedule_conservativeness)]
    if spec.load_format:
        cmd += ["--load-format", spec.load_format]
    if spec.skip_tokenizer_init:
        cmd += ["--skip-tokenizer-init"]
    return cmd + list(spec.prefill_args if prefill else spec.decode_args)


def router_command(spec: PDPairSpec) -> list[str]:
    """The sglang-router (`launch.worker_cmd.router_argv`) in front of the pair."""
    return router_argv(
        [(spec.url("prefill"), spec.bootstrap_port)],
        [spec.url("decode")],
        spec.host,
        spec.router_port,
        spec.url_host,
        spec.router_metrics_port,
        spec.router_args,
        python=spec.python,
    )


def pd_pair_commands(spec: PDPairSpec) -> dict[str, list[str]]:
    """The three command lines, in start order: prefill, decode, router."""
    return {
        "prefill": worker_command(spec, "prefill"),
        "decode": worker_command(spec, "decode"),
        "router": router_command(spec),
    }
