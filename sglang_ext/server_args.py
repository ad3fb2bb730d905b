"""ServerArgs: the worker's command line, by SGLang's flag names (the subset the torch backend has).

Called by `sglang_ext.engine.launch.main` and by tests. A flag SGLang has but this backend does not
support fails with an error that names it, instead of being silently ignored.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from sglang_ext.protocol import DEFAULT_BOOTSTRAP_PORT, DISAGG_MODES

# Requests a worker runs at once (decode: running + receiving KV). `moa-pd up` raises it on decode
# workers to what the configs' agents need at the deployment's concurrency
# (planning.pool_need.running_needs); real SGLang sizes it from memory.
DEFAULT_MAX_RUNNING_REQUESTS = 16


class UnsupportedFlagError(ValueError):
    """An SGLang flag the torch backend does not implement."""


@dataclass(slots=True)
class ServerArgs:
    model_path: str
    tokenizer_path: str | None = None
    host: str = "127.0.0.1"
    port: int = 30000
    backend: str = "torch"
    disaggregation_mode: str = "null"
    disaggregation_transfer_backend: str = "nixl"
    disaggregation_bootstrap_port: int = DEFAULT_BOOTSTRAP_PORT
    page_size: int = 1
    max_total_tokens: int | None = None  # None: engine.config.DEFAULT_MAX_TOTAL_TOKENS (16384)
    max_running_requests: int = DEFAULT_MAX_RUNNING_REQUESTS
    max_queued_requests: int = 256
    max_prefill_tokens: int = 4096
    chunked_prefill_size: int = 2048
    context_length: int | None = None  # None: the model's max_position_embeddings
    dtype: str = "float32"
    # "dummy": random weights of config.json's shape, no safetensors read (SGLang's convention)
    load_format: str = "auto"
    random_seed: int = 0
    served_model_name: str | None = None
    enable_metrics: bool = True
    log_level: str = "info"
    skip_tokenizer_init: bool = False
    # SGLang's priority scheduling: the waiting queue is sorted by a request's `priority` (larger
    # first unless low values first), then by arrival. As on SGLang's prefill server, nothing is
    # ever preempted: a started (chunked) prefill always goes on first.
    enable_priority_scheduling: bool = False
    schedule_low_priority_values_first: bool = False
    default_priority_value: int | None = None
    abort_on_priority_when_disabled: bool = False
    disable_priority_preemption: bool = False  # accepted: this backend never preempts

    def check(self) -> None:
        """Cross-field checks argparse cannot express; raises ValueError naming the flag."""
        if self.page_size < 1:
            raise ValueError(f"--page-size must be >= 1, got {self.page_size}")
        if self.max_running_requests < 1:
            raise ValueError("--max-running-requests must be >= 1")
        if self.max_total_tokens is not None and self.max_total_tokens < self.page_size:
            raise ValueError("--max-total-tokens must hold at least one page (--page-size)")
        if self.chunked_prefill_size < self.page_size:
            raise ValueError("--chunked-prefill-size must be >= --page-size")

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_path

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sglang_ext.launch_server --backend torch",
        description="CPU reference engine speaking SGLang's protocol",
        allow_abbrev=False,  # an abbreviation of a flag we lack must not match one we have
    )
    d = ServerArgs(model_path="")
    p.add_argument("--model-path", required=True)
    p.add_argument("--tokenizer-path", default=None)
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--backend", choices=["torch"], default="torch")
    p.add_argument("--disaggregation-mode", choices=list(DISAGG_MODES), default="null")
    # Only nixl: SGLang's 'fake' backend exists for decode-only tests and is refused on prefill;
    # here fake transfers are the prefill-only warm-ups (bootstrap_host FAKE_BOOTSTRAP_HOST).
    p.add_argument("--disaggregation-transfer-backend", choices=["nixl"], default="nixl")
    p.add_argument(
        "--disaggregation-bootstrap-port", type=int, default=d.disaggregation_bootstrap_port
    )
    p.add_argument("--page-size", type=int, default=d.page_size)
    p.add_argument("--max-total-tokens", type=int, default=None)
    p.add_argument("--max-running-requests", type=int, default=d.max_running_requests)
    p.add_argument("--max-queued-requests", type=int, default=d.max_queued_requests)
    p.add_argument("--max-prefill-tokens", type=int, default=d.max_prefill_tokens)
    p.add_argument("--chunked-prefill-size", type=int, default=d.chunked_prefill_size)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--load-format", choices=["auto", "dummy"], default=d.load_format)
    p.add_argument("--random-seed", type=int, default=d.random_seed)
    p.add_argument("--served-model-name", default=None)
    # Metrics are always served; the flag is accepted so SGLang command lines work unchanged.
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument(
        "--log-level",
        default=d.log_level,
        choices=["debug", "info", "warning", "error", "critical"],
    )
    p.add_argument("--skip-tokenizer-init", action="store_true")
    p.add_argument("--enable-priority-scheduling", action="store_true")
    p.add_argument("--schedule-low-priority-values-first", action="store_true")
    p.add_argument("--default-priority-value", type=int, default=None)
    p.add_argument("--abort-on-priority-when-disabled", action="store_true")
    # SGLang preempts running requests for higher-priority ones (null mode) unless this is set;
    # the torch backend never preempts, so it behaves as if it were always set.
    p.add_argument("--disable-priority-preemption", action="store_true")
    return p


def parse_args(argv: list[str] | None = None) -> ServerArgs:
    """Parse a command line; unknown SGLang flags raise UnsupportedFlagError naming them."""
    parser = make_parser()
    ns, unknown = parser.parse_known_args(argv)
    flags = [u.split("=", 1)[0] for u in unknown if u.startswith("-")]
    if flags:
        raise UnsupportedFlagError(
            f"unsupported flag(s) {', '.join(flags)}: the torch backend does not support them "
            f"(run with --backend sglang on a GPU machine, or drop them); supported flags: "
            f"{', '.join(sorted(a for act in parser._actions for a in act.option_strings))}"
        )
    if unknown:
        raise UnsupportedFlagError(f"unexpected argument(s): {' '.join(unknown)}")
    kw = vars(ns)
    kw["enable_metrics"] = True
    if kw["dtype"] == "auto":
        kw["dtype"] = "float32"
    args = ServerArgs(**kw)
    args.check()
    return args
