"""The simulated workers of one model: a prefill worker (the reference scheduler's batching: a
prefill in progress goes on first, then waiting requests in queue order, up to
`max_prefill_tokens` per forward and `chunked_prefill_size` per request; critical requests
before warm-ups when priority scheduling is on) and a decode worker (continuous batching: every
step advances each running sequence by one token, newcomers join at the next step, a step costs
the profile's time at the current batch and mean context). Both compute on a shared Device."""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import simpy

from profiling.profile_file import ModelProfile
from router.request_split import Claim, ReplicaLoad
from simulation.device import Device, TPGroup
from simulation.prefix_cache import Prompt, RadixCache, length


@dataclass(eq=False)
class PrefillJob:
    prompt: Prompt
    critical: bool
    done: simpy.Event
    seq: int = 0
    rank: int = 0  # its question's place under workflow priority (0 for all under FCFS)
    cached: int | None = None  # set when the job is admitted to a batch
    computed: int = 0
    queued_s: float = 0.0  # time in the waiting queue (queueing in the breakdown)


class PrefillWorker:
    def __init__(
        self,
        env: simpy.Environment,
        name: str,
        profile: ModelProfile,
        device: Device | TPGroup,
        max_prefill_tokens: int = 4096,
        chunked_prefill_size: int = 2048,
        priority_scheduling: bool = False,
    ) -> None:
        self.env, self.name, self.profile, self.device = env, name, profile, device
        self.budget, self.chunk = max_prefill_tokens, chunked_prefill_size
        self.priority = priority_scheduling
        self.cache = RadixCache()
        self.waiting: list[PrefillJob] = []
        self.started: list[PrefillJob] = []
        self._arrived = env.event()
        self._seq = 0
        env.process(self._loop())

    def submit(self, prompt: Prompt, critical: bool, rank: int = 0) -> PrefillJob:
        """Queue a prefill; its `done` event fires once its whole prompt is computed. Under
        priority scheduling critical jobs go first, then the lower `rank`, then arrival."""
        self._seq += 1
        job = PrefillJob(
            prompt, critical, self.env.event(), self._seq, rank=rank, queued_s=self.env.now
        )
        self.waiting.append(job)
        if not self._arrived.triggered:
            self._arrived.succeed()
        return job

    def _batch(self) -> list[tuple[PrefillJob, int]]:
        budget, batch = self.budget, []
        for job in self.started:
            if budget <= 0:
                break
            n = min(length(job.prompt) - job.computed, budget, self.chunk)
            batch.append((job, n))
            budget -= n
        if self.priority:
            self.waiting.sort(key=lambda j: (not j.critical, j.rank, j.seq))
        while budget > 0 and self.waiting:
            job = self.waiting.pop(0)
            # SGLang computes at least the last token even of a fully cached prompt.
            job.cached = min(self.cache.cached(job.prompt), length(job.prompt) - 1)
            job.computed = job.cached
            job.queued_s = self.env.now - job.queued_s
            self.started.append(job)
            n = min(length(job.prompt) - job.computed, budget, self.chunk)
            batch.append((job, n))
            budget -= n
        return batch

    def forward_seconds(self, batch: list[tuple[PrefillJob, int]]) -> float:
        """One forward over the batch: the profile's fixed cost once, each request's token and
        attention-over-context costs."""
        fixed = self.profile.prefill_seconds(0, 0)
        return fixed + sum(
            self.profile.prefill_seconds(n, job.computed) - fixed for job, n in batch
        )

    def _loop(self):
        while True:
            if not self.waiting and not self.started:
                self._arrived = self.env.event()
                yield self._arrived
            batch = self._batch()
            yield self.env.process(self.device.compute(self.name, self.forward_seconds(batch)))
            for job, n in batch:
                job.computed += n
                if job.computed >= length(job.prompt):
                    self.started.remove(job)
                    self.cache.insert(job.prompt)
                    job.done.succeed()


@dataclass(eq=False)
class Sequence:
    context: int  # tokens of context when it joins the batch (its prompt and first token)
    tokens: int  # tokens to decode
    done: simpy.Event
    first_step: int | None = None  # the worker's step count when it joined the batch
    cancelled: bool = False
    decoded_at_cancel: int = 0
    # (decoded, callback) asked for before it joined (when_decoded).
    watchers: list[tuple[int, Callable[[], None]]] = field(default_factory=list)


class DecodeWorker:
    """Continuous batching, counted by steps: a running sequence gains one token per step, so
    what it decoded is the steps since it joined. Nothing is done per token (a simulation decodes
    about a million); whoever needs a sequence's progress reads `decoded` or asks to be called
    back at a count (`when_decoded`), `on_tokens(n)` hears each step's tokens, and
    `on_step(since, n)` each step's end with the `n` sequences whose previous token came at
    `since` (the last step's end; those that joined at this step are left out, as a stream's
    first gap is by router/decode_slowdown.py)."""

    def __init__(
        self,
        env: simpy.Environment,
        name: str,
        profile: ModelProfile,
        device: Device | TPGroup,
        max_running_requests: int = 1 << 20,
        on_tokens: Callable[[int], None] | None = None,
        on_step: Callable[[float, int], None] | None = None,
    ) -> None:
        self.env, self.name, self.profile, self.device = env, name, profile, device
        # Requests admitted (running or receiving KV); a request takes one before its prefill
        # starts and holds it until it ends. Requested with its question's rank: the lowest
        # first, then arrival (all 0 under FCFS), as the decode worker's prealloc queue.
        self.slots = simpy.PriorityResource(env, capacity=max_running_requests)
        self.on_tokens, self.on_step = on_tokens, on_step
        self.running: dict[Sequence, None] = {}  # in the batch (a set in joining order)
        self._joining: list[Sequence] = []  # started: join at the next step
        self._context = 0  # the running sequences' tokens of context, all together
        self._order = itertools.count()  # ties in the heaps: first come first
        self._finish: list[tuple[int, int, Sequence]] = []  # (its last step, order, sequence)
        self._watch: list[tuple[int, int, Sequence, Callable[[], None]]] = []
        self._arrived = env.event()
        self.steps = 0
        env.process(self._loop())

    def start(self, context: int, tokens: int) -> Sequence:
        """Decode `tokens` tokens after `context` tokens, from the next step on."""
        seq = Sequence(context, tokens, self.env.event())
        if tokens <= 0:
            seq.done.succeed()
            return seq
        self._joining.append(seq)
        if not self._arrived.triggered:
            self._arrived.succeed()
        return seq

    def decoded(self, seq: Sequence) -> int:
        """Tokens `seq` has decoded so far."""
        if seq.cancelled:
            return seq.decoded_at_cancel
        if seq.first_step is None:
            return 0
        return min(seq.tokens, self.steps - seq.first_step)

    def when_decoded(self, seq: Sequence, count: int, callback: Callable[[], None]) -> None:
        """Call `callback` after the step at which `seq` has decoded `count` tokens (never if it
        ends or is cancelled before)."""
        if seq.cancelled or count > seq.tokens:
            return
        if seq.first_step is None:
            seq.watchers.append((count, callback))
        else:
            heapq.heappush(self._watch, (seq.first_step + count, next(self._order), seq, callback))

    def cancel(self, seq: Sequence) -> None:
        if seq.cancelled or seq.done.triggered:
            return
        seq.decoded_at_cancel = self.decoded(seq)
        seq.cancelled = True
        if seq in self.running:
            del self.running[seq]
            self._context -= seq.context + seq.decoded_at_cancel
        else:
            self._joining.remove(seq)
        seq.done.succeed()

    def _join(self) -> int:
        """Newcomers into the batch; returns how many."""
        joined = len(self._joining)
        for seq in self._joining:
            seq.first_step = self.steps
            self.running[seq] = None
            self._context += seq.context
            heapq.heappush(self._finish, (self.steps + seq.tokens, next(self._order), seq))
            for count, callback in seq.watchers:
                heapq.heappush(self._watch, (self.steps + count, next(self._order), seq, callback))
            seq.watchers.clear()
        self._joining.clear()
        return joined

    def _loop(self):
        last_step_end = self.env.now
        while True:
            joined = self._join()
            if not self.running:
                self._arrived = self.env.event()
                yield self._arrived
                continue
            batch = len(self.running)
            seconds = self.profile.decode_step_seconds(batch, self._context / batch)
            yield self.env.process(self.device.compute(self.name, seconds))
            self.steps += 1
            n = len(self.running)  # those cancelled during the step decoded nothing in it
            self._context += n
            if self.on_tokens is not None and n:
                self.on_tokens(n)
            if self.on_step is not None and n > joined:
                self.on_step(last_step_end, n - joined)
            last_step_end = self.env.now
            while self._watch and self._watch[0][0] <= self.steps:
                _, _, seq, callback = heapq.heappop(self._watch)
                if not seq.cancelled:
                    callback()
            while self._finish and self._finish[0][0] <= self.steps:
                _, _, seq = heapq.heappop(self._finish)
                if not seq.cancelled:
                    del self.running[seq]
                    self._context -= seq.context + seq.tokens
                    seq.done.succeed()


@dataclass
class Replicas:
    """A model's workers and its request split (weights: each replica's share)."""

    prefill: list[PrefillWorker] = field(default_factory=list)
    prefill_share: list[float] = field(default_factory=list)
    decode: list[DecodeWorker] = field(default_factory=list)
    decode_share: list[float] = field(default_factory=list)
    # Breaks exact ties between replicas (seeded: a simulation is reproducible).
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    _load: dict[str, ReplicaLoad] = field(default_factory=dict)

    def choose(self, role: str) -> Claim:
        """The shell router's choice (router/request_split.py): the replica of `role` with the
        least open requests for its share, counted open there until the claim is released."""
        if role not in self._load:
            shares = self.prefill_share if role == "prefill" else self.decode_share
            self._load[role] = ReplicaLoad(len(shares), shares, self.rng)
        return self._load[role].choose()
