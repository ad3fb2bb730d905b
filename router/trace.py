"""Per-agent trace of one question: timings (seconds since the session started), warm-ups, the
final request's prompt/cached tokens as the prefill worker reported them, slot order, killed,
routed out. The question's routing decision (routing/choose.py) and posterior corrections
(routing/posterior.py) are recorded beside it by the orchestrator. Filled by the orchestrator;
returned by the whole-graph endpoint and read by benchmarks."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field


@dataclass(slots=True)
class AgentTrace:
    model: str
    layer: int
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    start_s: float | None = None
    first_token_s: float | None = None
    end_s: float | None = None
    # When the agent's (final) request went out: a leaf's at once; a successor's once every slot
    # is complete. The exposed part of its prefill is first_token_s - final_request_s.
    final_request_s: float | None = None
    # When the prefill worker replied to the final request (successors: we dispatch both halves).
    prefill_reply_s: float | None = None
    # The final request's timings as the workers reported them ("prefill.<meta_info key>").
    worker_timing: dict[str, float] = field(default_factory=dict)
    warmups: int = 0
    # Token count of each warm-up, in order (chunking studies read it).
    warmup_lengths: list[int] = field(default_factory=list)
    warmup_cached_tokens: int = 0
    # Each warm-up as [sent_s, replied_s, tokens, cached_tokens] (timelines read it).
    warmup_spans: list[list[float]] = field(default_factory=list)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    slot_order: list[str] = field(default_factory=list)
    # Its place in the order the whole graph's agents started (router/priority.start_order);
    # None where a client started agents one by one.
    start_index: int | None = None
    # The model's prefill worker that served it, by its index in the cluster's prefill_urls
    # (never the URL: traces go back to API clients, who must not see internal addresses).
    prefill_replica: int | None = None
    killed: bool = False
    # Routing left this pool candidate out of the question (it never ran).
    routed_out: bool = False
    error: str | None = None
    finish_reason: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class Clock:
    """Seconds since the session started."""

    def __init__(self) -> None:
        self._t0 = time.perf_counter()
        self.wall_t0 = time.time()

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def at(self, perf_counter_t: float) -> float:
        """A `time.perf_counter()` reading on this clock."""
        return perf_counter_t - self._t0
