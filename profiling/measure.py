"""Measuring one model of a running PD deployment: prefill (cold and after a cached prefix)
straight on its prefill worker, decode steps over the PD path, and the PD path's fixed cost
(TTFT minus the prefill). Streamed requests go out as the shell router sends them (both workers
dispatched by us, router/pd.py `dual`). Every prompt is fresh random token ids, so nothing is
cached by accident."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from profiling.decode_step import median, step_seconds
from profiling.knobs import Knobs
from profiling.profile_file import DecodePoint, PDPoint, PrefillPoint
from router.pd import Deployment, PrefillTarget
from sglang_ext import protocol as P

# Random prompt ids start here: below are special and control tokens of most tokenizers.
LOW_TOKEN_ID = 100
# New tokens of a decode point's short run (its long run has decode_tokens more).
SHORT_RUN = 4


@dataclass(slots=True)
class StreamTimes:
    """One streamed request: (arrival time, tokens generated so far) per chunk with tokens, and
    its prefill worker's own forward span (None where the worker reports none)."""

    chunks: list[tuple[float, int]] = field(default_factory=list)
    prefill_span_s: float | None = None

    @property
    def first(self) -> float:
        return self.chunks[0][0]

    @property
    def last(self) -> float:
        return self.chunks[-1][0]


class ProfileError(RuntimeError):
    """A measurement that cannot be made as asked; the message says what to change."""


@dataclass(slots=True)
class PrefillSample:
    new_tokens: int
    cached_tokens: int
    wall_s: float  # the client's HTTP round trip
    span_s: float | None  # the worker's own forward_entry -> prefill_finished, where reported


@dataclass(slots=True)
class ModelRun:
    """Everything measured on one model, before it becomes a ModelProfile."""

    prefill: list[PrefillSample] = field(default_factory=list)
    decode: list[DecodePoint] = field(default_factory=list)
    ttft: dict[int, list[float]] = field(default_factory=dict)  # prompt length -> TTFTs
    # prompt length -> TTFT minus that request's own prefill span, where the worker reported it:
    # the PD path without the prefill's run-to-run noise (which hides a KV transfer's tens of ms
    # under a second-long CPU prefill).
    pd_path: dict[int, list[float]] = field(default_factory=dict)

    @property
    def uses_worker_span(self) -> bool:
        """Prefill is timed by the worker's own span when every sample has one (SGLang with
        --enable-metrics and the reference engine report it), else by the HTTP round trip."""
        return bool(self.prefill) and all(s.span_s is not None for s in self.prefill)

    def prefill_points(self) -> list[PrefillPoint]:
        """Median seconds per (new, cached) point."""
        groups: dict[tuple[int, int], list[float]] = {}
        span = self.uses_worker_span
        for s in self.prefill:
            key = (s.new_tokens, s.cached_tokens)
            groups.setdefault(key, []).append(s.span_s if span else s.wall_s)  # type: ignore[arg-type]
        return [
            PrefillPoint(new_tokens=n, cached_tokens=c, seconds=median(v))
            for (n, c), v in sorted(groups.items())
        ]

    def pd_samples(self) -> dict[int, list[float]]:
        """The PD path per prompt length, one sample per request: its TTFT less its own prefill
        span where the workers reported spans, else less the cold prefill median there."""
        if self.pd_path:
            return self.pd_path
        cold = {p.new_tokens: p.seconds for p in self.prefill_points() if p.cached_tokens == 0}
        return {n: [t - cold[n] for t in ts] for n, ts in self.ttft.items() if n in cold}

    def pd_points(self) -> list[PDPoint]:
        """Per prompt length, the median of its samples (never negative)."""
        return [
            PDPoint(prompt_tokens=n, seconds=max(0.0, median(ds)))
            for n, ds in sorted(self.pd_samples().items())
            if ds
        ]

    def pd_fixed_seconds(self) -> float:
        """Median of every sample of the PD path, over lengths and repetitions; never negative
        (a TTFT can undercut a prefill median by noise)."""
        diffs = [d for ds in self.pd_samples().values() for d in ds]
        if not diffs:
            raise ProfileError("no TTFT at a cold prefill length: nothing to derive pd_fixed from")
        return max(0.0, median(diffs))


def random_prompt(rng: random.Random, length: int, vocab: int) -> list[int]:
    return [rng.randrange(LOW_TOKEN_ID, vocab) for _ in range(length)]


def model_vocab(model_path: str, tokenizer_path: str) -> int:
    """The smaller of the model's vocabulary and its tokenizer's: random prompt ids stay below
    both (a shape-only model may pair a 151k-row embedding with SmolLM2's 49k tokenizer).
    ValueError names what could not be read. The TTFT benchmark uses it too."""
    from transformers import AutoConfig, AutoTokenizer

    sizes = []
    try:
        sizes.append(int(AutoConfig.from_pretrained(model_path).vocab_size))
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"cannot read the vocabulary size of model {model_path}: {e}") from None
    try:
        sizes.append(len(AutoTokenizer.from_pretrained(tokenizer_path or model_path)))
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot load the tokenizer {tokenizer_path}: {e}") from None
    return min(sizes)


def _span(meta: dict) -> float | None:
    start, end = meta.get(P.FORWARD_ENTRY_TIME), meta.get(P.PREFILL_FINISHED_TIME)
    if isinstance(start, (int, float)) and isinstance(end, (int, float)) and end > start:
        return float(end - start)
    return None


class ModelProber:
    """The measurements of one model; `tick(label)` is called after each measured request."""

    def __init__(
        self,
        dep: Deployment,
        vocab: int,
        knobs: Knobs,
        rng: random.Random,
        tick: Callable[[str], None] = lambda label: None,
    ) -> None:
        self.dep, self.vocab, self.knobs, self.rng, self.tick = dep, vocab, knobs, rng, tick
        self.run = ModelRun()

    def prompt(self, length: int) -> list[int]:
        return random_prompt(self.rng, length, self.vocab)

    # --- prefill: the warm-up verb on the prefill worker (KV into its radix cache, no transfer) --
    async def _warm(
        self, ids: list[int], target: PrefillTarget | None = None
    ) -> tuple[float, dict]:
        """One warm-up on `target` (else a prefill worker picked, and released, here)."""
        picked = target is None
        target = target or self.dep.pick_prefill()
        try:
            t0 = time.perf_counter()
            meta = await self.dep.warmup(target, ids, f"{P.WARMUP_RID_PREFIX}{uuid.uuid4().hex}")
            return time.perf_counter() - t0, meta
        finally:
            if picked:
                self.dep.unpin(target)

    async def cold_prefill(self, length: int) -> PrefillSample:
        wall, meta = await self._warm(self.prompt(length))
        cached = int(meta.get(P.CACHED_TOKENS) or 0)
        # Wall time is the HTTP round trip, not reduced by an "empty request" overhead: the
        # verb refuses an empty prompt, and a 1-token prefill is a real forward pass (weights
        # read once), so subtracting it would remove real cost. Where the worker reports its
        # own forward span (the usual case), that is used instead (ModelRun.uses_worker_span),
        # and the fitted fixed term absorbs what is left of the overhead.
        return PrefillSample(length - cached, cached, wall, _span(meta))

    async def cached_prefill(self, prefix: int, new: int) -> PrefillSample:
        """Warm a fresh prefix of `prefix` tokens, then time prefix + `new` fresh tokens."""
        ids = self.prompt(prefix)
        # Both on one prefill worker: with replicas, a second pick may land on another one,
        # whose cache never saw the prefix.
        with self.dep.pinned() as target:
            await self._warm(ids, target)
            wall, meta = await self._warm(ids + self.prompt(new), target)
        cached = int(meta.get(P.CACHED_TOKENS) or 0)
        if cached < prefix // 2:
            raise ProfileError(
                f"model {self.dep.name}: a {prefix}-token prefix warmed just before was not reused "
                f"({cached} tokens cached); is the prefill worker's radix cache disabled?"
            )
        return PrefillSample(prefix + new - cached, cached, wall, _span(meta))

    # --- the PD path: TTFT as the shell router sends a request (router/pd.py `dual`) ------------
    async def _stream(self, ids: list[int], max_new: int) -> StreamTimes:
        body = {
            P.INPUT_IDS: ids,
            P.SAMPLING_PARAMS: {
                P.MAX_NEW_TOKENS: max_new,
                P.TEMPERATURE: 0.0,
                P.IGNORE_EOS: True,
            },
            P.RID: f"profile-{uuid.uuid4().hex}",
        }
        times = StreamTimes()
        seen = 0
        with self.dep.pinned() as target:
            call = self.dep.dual(body, target)
            async for chunk in call.stream:
                now = time.perf_counter()
                meta = chunk.get(P.META_INFO) or {}
                # completion_tokens counts what was generated so far; SGLang may stream several
                # tokens in one chunk.
                n = len(chunk.get(P.OUTPUT_IDS) or [])
                done = int(meta.get(P.COMPLETION_TOKENS) or (seen + n))
                if done > seen:
                    times.chunks.append((now, done))
                    seen = done
        if not times.chunks:
            raise ProfileError(f"model {self.dep.name}: a streamed request returned no token")
        times.prefill_span_s = _span(call.prefill.meta)
        return times

    async def ttft(self, length: int) -> tuple[float, float | None]:
        """A fresh prompt's TTFT and its prefill worker's own span (None: not reported)."""
        t0 = time.perf_counter()
        # Two tokens: the first is what prefill sampled, sent on by decode once the KV arrived.
        times = await self._stream(self.prompt(length), 2)
        return times.first - t0, times.prefill_span_s

    # --- decode: B concurrent streams over the PD path, twice --------------------------------
    async def _finish_times(self, prompts: list[list[int]], tokens: int) -> list[float]:
        """Seconds from sending to the last token of each of the streams, sent together."""
        t0 = time.perf_counter()
        streams = await asyncio.gather(*(self._stream(ids, tokens) for ids in prompts))
        for s in streams:
            if s.chunks[-1][1] != tokens:
                raise ProfileError(
                    f"model {self.dep.name}: a stream ended after {s.chunks[-1][1]} of {tokens} "
                    "tokens despite ignore_eos (is the context length too short?)"
                )
        return [s.last - t0 for s in streams]

    async def decode_point(self, batch: int, context: int) -> DecodePoint:
        """B streams of `context`-token prompts, run to SHORT_RUN and to SHORT_RUN +
        decode_tokens new tokens (profiling/decode_step.py says why two runs)."""
        prompts = [self.prompt(context) for _ in range(batch)]
        # Prefilled into the prefill worker's radix cache first, so the streams' own prefills
        # are cache hits and they start together rather than one cold prefill after another.
        for ids in prompts:
            await self._warm(ids)
        short, long = SHORT_RUN, SHORT_RUN + self.knobs.decode_tokens
        # Short and long runs alternate, up to 3 pairs: one pair's difference is a few decode
        # steps, and on a loaded CPU one slow run can make it negative.
        finish_short: list[float] = []
        finish_long: list[float] = []
        for _ in range(min(3, self.knobs.reps)):
            finish_short.append(median(await self._finish_times(prompts, short)))
            finish_long.append(median(await self._finish_times(prompts, long)))
        step = step_seconds(finish_short, finish_long, long - short)
        if step <= 0:
            raise ProfileError(
                f"model {self.dep.name}: at batch {batch} and context {context} the "
                f"{long - short} extra decode tokens took no measurable time (run to {short} "
                f"tokens: {median(finish_short):.3f} s, to {long}: {median(finish_long):.3f} s); "
                "raise --decode-tokens or profile on a quieter machine"
            )
        # Mean context over the steps the difference measures.
        return DecodePoint(batch=batch, context=context + (short + long) // 2, step_seconds=step)

    # --- the whole model -----------------------------------------------------------------------
    async def measure(self) -> ModelRun:
        k = self.knobs
        # One-off costs (allocators, lazy init, Triton compiles: 34 s for the first warm-up of an
        # 8B worker on an H200) are paid here, unmeasured.
        for length in self.first_pass_lengths(k):
            await self.cold_prefill(length)
            await self.ttft(length)
            self.tick("first pass")
        for _ in range(k.reps):
            for length in k.prompt_lengths:
                self.run.prefill.append(await self.cold_prefill(length))
                self.tick(f"prefill {length}")
            for prefix in k.cached_prefixes:
                self.run.prefill.append(await self.cached_prefill(prefix, k.cached_new_tokens))
                self.tick(f"prefill {k.cached_new_tokens} after {prefix}")
            for length in k.prompt_lengths:
                ttft, span = await self.ttft(length)
                self.run.ttft.setdefault(length, []).append(ttft)
                if span is not None:
                    self.run.pd_path.setdefault(length, []).append(ttft - span)
                self.tick(f"ttft {length}")
        for context in k.decode_contexts:
            for batch in k.decode_batches:
                self.run.decode.append(await self.decode_point(batch, context))
                self.tick(f"decode b{batch} c{context}")
        return self.run

    @staticmethod
    def first_pass_lengths(knobs: Knobs) -> list[int]:
        """The shortest and the longest prompt (each path's lazy start, the largest buffers)."""
        return sorted({min(knobs.prompt_lengths), max(knobs.prompt_lengths)})

    @classmethod
    def steps(cls, knobs: Knobs) -> int:
        """Ticks `measure` makes (the progress bar's total)."""
        per_rep = 2 * len(knobs.prompt_lengths) + len(knobs.cached_prefixes)
        decode = len(knobs.decode_batches) * len(knobs.decode_contexts)
        return len(cls.first_pass_lengths(knobs)) + knobs.reps * per_rep + decode
