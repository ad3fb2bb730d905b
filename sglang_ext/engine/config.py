"""EngineConfig: the scheduler's sizes and limits, derived from ServerArgs and the model config.

Built by `Engine`; read by the scheduler and the PD queues. Timeouts come from SGLang's own env vars
(SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, SGLANG_DISAGGREGATION_WAITING_TIMEOUT) so tests and users
set them the same way for both backends.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sglang_ext.server_args import ServerArgs

# Default KV pool size when --max-total-tokens is not given (SmolLM2-135M fp32: ~1.5 GB).
DEFAULT_MAX_TOTAL_TOKENS = 16384


@dataclass(frozen=True, slots=True)
class EngineConfig:
    mode: str  # "null" | "prefill" | "decode"
    page_size: int
    num_pages: int
    max_running_requests: int
    max_queued_requests: int
    max_prefill_tokens: int
    chunked_prefill_size: int
    context_length: int
    vocab_size: int
    eos_token_ids: frozenset[int]
    random_seed: int
    bootstrap_timeout_s: float  # prefill: decode must connect within this
    waiting_timeout_s: float  # decode: the KV must arrive within this
    host: str = "127.0.0.1"
    bootstrap_port: int = 8998
    # SGLang's priority scheduling flags (server_args.py says what each means).
    enable_priority_scheduling: bool = False
    schedule_low_priority_values_first: bool = False
    default_priority_value: int | None = None
    abort_on_priority_when_disabled: bool = False

    @property
    def max_total_tokens(self) -> int:
        return self.num_pages * self.page_size

    @property
    def uses_radix_cache(self) -> bool:
        return self.mode != "decode"  # decode keeps no radix cache, as SGLang

    @classmethod
    def from_args(
        cls, args: ServerArgs, model_config, extra_eos: tuple[int, ...] = ()
    ) -> EngineConfig:
        model_ctx = _attr(model_config, "max_position", "max_position_embeddings")
        ctx = args.context_length or model_ctx or 4096
        total = args.max_total_tokens or DEFAULT_MAX_TOTAL_TOKENS
        eos = _attr(model_config, "eos_token_ids", "eos_token_id")
        eos = frozenset([eos] if isinstance(eos, int) else (eos or [])) | set(extra_eos)
        return cls(
            mode=args.disaggregation_mode,
            page_size=args.page_size,
            num_pages=total // args.page_size,
            max_running_requests=args.max_running_requests,
            max_queued_requests=args.max_queued_requests,
            max_prefill_tokens=args.max_prefill_tokens,
            chunked_prefill_size=args.chunked_prefill_size,
            context_length=ctx,
            vocab_size=_attr(model_config, "vocab_size"),
            eos_token_ids=eos,
            random_seed=args.random_seed,
            bootstrap_timeout_s=float(
                os.environ.get("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "300")
            ),
            waiting_timeout_s=float(os.environ.get("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "300")),
            host=args.host,
            bootstrap_port=args.disaggregation_bootstrap_port,
            enable_priority_scheduling=args.enable_priority_scheduling,
            schedule_low_priority_values_first=args.schedule_low_priority_values_first,
            default_priority_value=args.default_priority_value,
            abort_on_priority_when_disabled=args.abort_on_priority_when_disabled,
        )


def _attr(obj, *names):
    for n in names:
        v = getattr(obj, n, None)
        if v is not None:
            return v
    return None
