"""A request inside the engine (`Req`), its `SamplingParams`, and the `OutputChunk`s it emits.

Built by the HTTP layer (`generate_io.py`), mutated only by the engine thread (the scheduler),
read back by the HTTP layer through OutputChunks delivered on its asyncio loop.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sglang_ext import protocol as P
from sglang_ext.engine.time_stats import ReqTimeStats


class BadRequestError(ValueError):
    """Client error: becomes an HTTP 400 whose message says what is wrong."""


@dataclass(slots=True)
class SamplingParams:
    max_new_tokens: int = P.DEFAULT_MAX_NEW_TOKENS
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    sampling_seed: int | None = None
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    n: int = 1

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def penalized(self) -> bool:
        return bool(
            self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1.0
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, vocab_size: int) -> SamplingParams:
        """Validate SGLang's sampling_params; unknown keys are rejected, as SGLang 0.5.23 does."""
        d = dict(d or {})
        known = set(cls.__slots__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise BadRequestError(
                f"unknown sampling_params key(s) {unknown}; supported: {sorted(known)}"
            )
        if isinstance(d.get("stop"), str):
            d["stop"] = [d["stop"]]
        d = {k: v for k, v in d.items() if v is not None or k == "sampling_seed"}
        try:
            sp = cls(**d)
        except TypeError as e:
            raise BadRequestError(f"bad sampling_params: {e}") from None
        sp._verify(vocab_size)
        return sp

    def _verify(self, vocab_size: int) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise BadRequestError(f"sampling_params: {msg}")

        num = (int, float)
        need(
            isinstance(self.max_new_tokens, int)
            and not isinstance(self.max_new_tokens, bool)
            and self.max_new_tokens >= 0,
            f"max_new_tokens must be an integer >= 0, got {self.max_new_tokens!r}",
        )
        need(
            isinstance(self.min_new_tokens, int) and self.min_new_tokens >= 0,
            "min_new_tokens must be an integer >= 0",
        )
        need(
            isinstance(self.temperature, num) and self.temperature >= 0,
            f"temperature must be >= 0, got {self.temperature!r}",
        )
        need(
            isinstance(self.top_p, num) and 0 < self.top_p <= 1,
            f"top_p must be in (0, 1], got {self.top_p!r}",
        )
        need(
            isinstance(self.top_k, int) and (self.top_k == -1 or self.top_k >= 1),
            f"top_k must be -1 (disabled) or >= 1, got {self.top_k!r}",
        )
        need(isinstance(self.min_p, num) and 0 <= self.min_p <= 1, "min_p must be in [0, 1]")
        need(
            isinstance(self.stop, list) and all(isinstance(s, str) and s for s in self.stop),
            "stop must be a non-empty string or a list of them",
        )
        need(
            isinstance(self.stop_token_ids, list)
            and all(isinstance(t, int) and 0 <= t < vocab_size for t in self.stop_token_ids),
            f"stop_token_ids must be token ids in [0, {vocab_size})",
        )
        need(
            self.sampling_seed is None or isinstance(self.sampling_seed, int),
            "sampling_seed must be an integer",
        )
        need(
            isinstance(self.frequency_penalty, num) and -2 <= self.frequency_penalty <= 2,
            "frequency_penalty must be in [-2, 2]",
        )
        need(
            isinstance(self.presence_penalty, num) and -2 <= self.presence_penalty <= 2,
            "presence_penalty must be in [-2, 2]",
        )
        need(
            isinstance(self.repetition_penalty, num) and 0 < self.repetition_penalty <= 2,
            "repetition_penalty must be in (0, 2]",
        )
        need(self.n == 1, "n > 1 is not supported by the torch backend; send n requests")


@dataclass(slots=True)
class OutputChunk:
    """What one engine step produced for one request (ids and logprobs are new ones only)."""

    new_ids: list[int]
    new_logprobs: list[float]
    new_top_logprobs: list[list[tuple[float, int]]]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: dict | None = None
    status: int = 200  # non-200: the request failed; finish_reason carries the message

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class ReqState(enum.Enum):
    """Where a live request is; only the scheduler moves it (SGLang's queue names in comments)."""

    BOOTSTRAP = "bootstrap"  # prefill: waiting for decode's destination (bootstrap queue)
    WAITING = "waiting"  # for a prefill slot and pages
    PREFILLING = "prefilling"  # its prompt is being computed, chunk by chunk
    SENDING = "sending"  # prefill: its KV is on the way to decode (inflight queue)
    PREALLOC = "prealloc"  # decode: waiting for pages (prealloc queue)
    RECEIVING = "receiving"  # decode: its KV is arriving (transfer queue)
    RUNNING = "running"  # decoding
    DONE = "done"  # finished, aborted or failed; leaves the table at the end of the step


@dataclass(slots=True, eq=False)
class Req:
    rid: str
    input_ids: list[int]
    sampling: SamplingParams
    return_logprob: bool = False
    top_logprobs_num: int = 0
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    bootstrap_room: int | None = None
    on_output: Callable[[OutputChunk], None] | None = None
    eos_token_ids: frozenset[int] = frozenset()
    # SGLang's `priority` (None: not given; the scheduler fills in the default when it sorts).
    priority: int | None = None
    time_stats: ReqTimeStats = field(default_factory=ReqTimeStats)
    # --- engine state (set by the scheduler only) ---
    state: ReqState | None = None  # None until the scheduler takes it
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    emitted: int = 0  # output tokens already sent in an OutputChunk
    finish_reason: dict | None = None
    status: int = 200
    cached_tokens: int = 0  # prompt tokens whose KV came from the radix cache (or prefill)
    row: int | None = None  # row in ReqToTokenPool
    pages: list[int] = field(default_factory=list)  # every page of the sequence, in order
    num_prefix_pages: int = 0  # leading pages owned by the radix cache (locked via last_node)
    last_node: Any = None
    num_computed: int = 0  # tokens whose KV is in the buffer
    reserved_pages: int = 0  # pages it may still allocate (admission reserved them)
    kv_sender: Any = None  # prefill: KVSender until the KV reached decode (or failed)
    kv_receiver: Any = None  # decode: KVReceiver until the KV arrived (or failed)

    @property
    def prompt_len(self) -> int:
        return len(self.input_ids)

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    @property
    def all_ids(self) -> list[int]:
        return self.input_ids + self.output_ids

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def holds_resources(self) -> bool:
        """Pages, a table row or a KV transfer are still attached (the engine must keep it)."""
        return self.row is not None or self.kv_sender is not None or self.kv_receiver is not None

    def finish(self, reason: dict, status: int = 200) -> None:
        """Record a normal finish; the first one wins (EOS vs length on the same token)."""
        if self.finish_reason is None:
            self.finish_reason, self.status = reason, status

    def fail(self, message: str, status: int = 200) -> None:
        """Abort (status 200: by request; else an error). Overrides a finish not yet delivered,
        e.g. a prefill whose first token was sampled but whose KV never reached decode."""
        self.finish_reason, self.status = {"type": P.FINISH_ABORT, "message": message}, status

    def emit(self) -> None:
        """Send the tokens not yet emitted (and the finish reason, if finished) to the client."""
        if self.on_output is None:
            return
        a, b = self.emitted, len(self.output_ids)
        self.emitted = b
        self.on_output(
            OutputChunk(
                self.output_ids[a:b],
                self.output_logprobs[a:b],
                self.output_top_logprobs[a:b],
                self.prompt_len,
                len(self.output_ids),
                self.cached_tokens,
                self.finish_reason,
                self.status,
            )
        )
