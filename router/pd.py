"""One model's PD deployment as the shell router uses it: warm-ups straight to a prefill worker,
and every agent's PD request sent by us to a (prefill worker, DP rank) plus a decode worker;
a successor's warm-ups and final request stick to one prefill target.

Why we dispatch PD requests ourselves rather than through sglang-router 0.3.2 (which stays in
front of each model for clients that call it directly, by its own policy):
- it picks the prefill worker by its own policy (pinning needs `--policy manual` plus a header
  on every request, which the launcher would have to configure);
- it drains the prefill reply, so `cached_tokens` as the prefill worker saw it is lost
  (sglang-notes fact 7);
- it awaits both workers' response headers before it streams decode's tokens
  (`tokio::join!` in its dual dispatch), and a prefill worker answers only once its scheduler
  polled the finished KV transfer, after the forward batch under way: on a CPU every leaf's
  first tokens were held 0.5-1.9 s at a question's start (docs/benchmarks.md, "The first-token
  hold"; `via_router` stays for that benchmark and bench_ttft's comparison).
Sending the same JSON to both workers with the bootstrap fields is the router's whole job
(fact 6), a few lines here (`dual`), and streams decode's tokens as they come.

Replicas are chosen by router/request_split.py's rule, the simulator's too: the least open
requests per unit of the plan's share (the cluster file's `prefill_shares`/`decode_shares`; equal
without a plan), at the moment of sending: a successor's prefill worker when its warm-ups start
(its warm-ups and final request stay there), any other request's when it is sent, each
request's decode worker when it is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import urlparse

from router.cluster import ModelDeployment, Timeouts
from router.compute_device import ComputeDevice
from router.metrics import RouterMetrics
from router.prefill_gate import CriticalHold, PrefillGate, hold
from router.priority import RequestOrder
from router.request_split import Claim, ReplicaLoad
from router.sglang_client import SGLangClient
from sglang_ext import protocol as P


@dataclass(frozen=True, slots=True)
class PrefillTarget:
    """Where every warm-up and the final request of one successor go. `claims`: its open
    requests (router/request_split.py) on its prefill worker (`pick_prefill`'s) and decode
    worker (`dual`'s); `unpin` releases those still open."""

    index: int
    url: str
    bootstrap_port: int | None
    dp_rank: int
    dp_size: int
    # The arrival number of the question whose requests go here (router/priority.py); None: FCFS.
    question: int | None = None
    claims: dict[str, Claim] = field(default_factory=dict, compare=False, repr=False)

    @property
    def host(self) -> str:
        return urlparse(self.url).hostname or "127.0.0.1"


@dataclass(slots=True)
class PrefillReply:
    """The prefill worker's reply to a request we dispatched to both workers ourselves: its
    meta_info, and when it arrived (`time.perf_counter()`; None until then)."""

    meta: dict = field(default_factory=dict)
    at: float | None = None


@dataclass(slots=True)
class PDCall:
    """One streamed generate request; `prefill` fills in while it streams when we dispatched
    to both workers ourselves (it stays empty through the native sglang-router)."""

    rid: str
    stream: AsyncIterator[dict]
    abort_urls: list[str]
    # The critical prefill this call holds on its prefill worker(s)' gates; the caller releases
    # it at the first token (the prefill is over by then), the stream at the latest when it ends.
    hold: CriticalHold
    prefill: PrefillReply = field(default_factory=PrefillReply)


class Deployment:
    def __init__(
        self,
        name: str,
        spec: ModelDeployment,
        client: SGLangClient,
        timeouts: Timeouts,
        warmup_verb: str,
        rng: random.Random | None = None,
        send_priority: bool = False,
        order: RequestOrder | None = None,
        gate: bool = True,
        is_down: Callable[[str], bool] = lambda url: False,
        devices: dict[str, ComputeDevice] | None = None,
        metrics: RouterMetrics | None = None,
    ) -> None:
        """`send_priority`: send SGLang's `priority` field, valued by `order` (only when the
        workers schedule by priority, else SGLang may refuse the field); `order` also ranks
        warm-ups at the gates (router/priority.py; default FCFS). `is_down(url)`:
        the health watch's verdict on a worker, so that no abort waits on a hung one. `devices`:
        the shared compute devices by name (empty: each gate looks at its own worker only).
        `metrics`: where each worker's load is counted (the router app's)."""
        self.name, self.spec, self._client, self._t = name, spec, client, timeouts
        self._is_down = is_down
        self._warmup_verb = warmup_verb
        self._send_priority = send_priority
        self._order = order or RequestOrder()
        # Without the gate (measurements only) nothing waits: any number of warm-ups in flight.
        cap = 1 if gate else 1 << 30
        self._gates = [PrefillGate(cap, enforce_critical=gate) for _ in spec.prefill_urls]
        devices = devices or {}
        for url, g, d in zip(spec.prefill_urls, self._gates, spec.prefill_devices):
            if d in devices:
                devices[d].attach(url, g)
        # Decode workers by URL -> their device, to count their open streams as busy.
        self._decode_devices = {
            url: devices[d] for url, d in zip(spec.decode_urls, spec.decode_devices) if d in devices
        }
        self._rng = rng or random.Random()
        self._metrics = metrics or RouterMetrics()
        # Each worker's open requests and requests sent, per role, for the replica choice.
        self._load = {
            "prefill": ReplicaLoad(len(spec.prefill_urls), spec.prefill_shares, self._rng),
            "decode": ReplicaLoad(len(spec.decode_urls), spec.decode_shares, self._rng),
        }
        slots = [(i, r) for i in range(len(spec.prefill_urls)) for r in range(spec.prefill_dp_size)]
        # Successors currently pinned to each (prefill worker, DP rank).
        self._pinned = {s: 0 for s in slots}
        self._pick_rr = itertools.count()

    # --- stickiness ---------------------------------------------------------------------------
    def pick_prefill(self, question: int | None = None) -> PrefillTarget:
        """The prefill worker with the least open requests for its share (router/request_split.py;
        the request, or successor, counts open there until its final prefill replied), then its
        least-pinned DP rank (ties rotate). Call it when the first request for it goes out;
        release it with `unpin`. `question`: the arrival number of the request's question, which
        ranks its requests (router/priority.py)."""
        claim = self._load["prefill"].choose()
        n = next(self._pick_rr)
        keys = [k for k in self._pinned if k[0] == claim.index]
        order = keys[n % len(keys) :] + keys[: n % len(keys)]
        index, rank = min(order, key=lambda k: self._pinned[k])
        self._pinned[(index, rank)] += 1
        return PrefillTarget(
            index,
            self.spec.prefill_urls[index],
            self.spec.bootstrap_port(index),
            rank,
            self.spec.prefill_dp_size,
            question,
            {"prefill": claim},
        )

    @contextlib.contextmanager
    def pinned(self, question: int | None = None) -> Iterator[PrefillTarget]:
        """`pick_prefill` for the body of the block, `unpin` after it."""
        target = self.pick_prefill(question)
        try:
            yield target
        finally:
            self.unpin(target)

    def unpin(self, target: PrefillTarget) -> None:
        """The successor (or request) is over: its pin, and whatever it still held open."""
        self._pinned[(target.index, target.dp_rank)] -= 1
        for claim in target.claims.values():
            claim.release()

    def _room(self, target: PrefillTarget) -> int:
        return P.new_bootstrap_room(target.dp_rank, target.dp_size, self._rng)

    def gate(self, target: PrefillTarget) -> PrefillGate:
        """The warm-up gate of the target's prefill worker (shared by all DP ranks: they share
        the worker's compute)."""
        return self._gates[target.index]

    def warmup_rank(self, target: PrefillTarget) -> int:
        """Where the target's warm-ups queue at its gate: smaller first (the priority negated)."""
        return -self._order.value(False, target.question)

    def _with_priority(self, body: dict, critical: bool, question: int | None = None) -> dict:
        if not self._send_priority:
            return body
        return {**body, P.PRIORITY: self._order.value(critical, question)}

    # --- requests -----------------------------------------------------------------------------
    async def warmup(self, target: PrefillTarget, input_ids: list[int], rid: str) -> dict:
        """Prefill `input_ids` into the target's radix cache; nothing goes to decode.
        Returns the reply's meta_info (prompt_tokens, cached_tokens)."""
        load = self._metrics.worker_load(self.name, "prefill", target.index)
        try:
            return await self._send_warmup(target, input_ids, rid)
        finally:
            load.end()

    async def _send_warmup(self, target: PrefillTarget, input_ids: list[int], rid: str) -> dict:
        if self._warmup_verb == "prefill_only":
            # The room pins the DP rank (room % dp_size), as on the final request: without it
            # the verb draws a random room and the warm-up may fill another rank's cache.
            body = {P.INPUT_IDS: input_ids, P.RID: rid, P.BOOTSTRAP_ROOM: self._room(target)}
            reply = await self._client.post_json(
                f"{target.url}{P.PREFILL_ONLY_PATH}",
                self._with_priority(body, False, target.question),
                "warm-up",
                self._t.warmup_s,
            )
            return reply.get(P.META_INFO, reply)
        body = {
            P.INPUT_IDS: input_ids,
            P.SAMPLING_PARAMS: {P.MAX_NEW_TOKENS: 1, P.TEMPERATURE: 0.0},
            P.STREAM: False,
            P.RID: rid,
            P.BOOTSTRAP_HOST: P.FAKE_BOOTSTRAP_HOST,
            P.BOOTSTRAP_PORT: target.bootstrap_port,
            P.BOOTSTRAP_ROOM: self._room(target),
        }
        reply = await self._client.post_json(
            f"{target.url}/generate",
            self._with_priority(body, False, target.question),
            "warm-up",
            self._t.warmup_s,
        )
        return reply.get(P.META_INFO, {})

    def via_router(self, body: dict) -> PDCall:
        """A request through the native sglang-router, for benchmarks that compare it with
        `dual` (it picks the pair, so the request holds every prefill worker's gate of this
        model until its prefill is over)."""
        held = hold(self._gates)
        body = self._with_priority(body, critical=True)
        stream = self._client.stream(f"{self.spec.router_url}/generate", body, "router")
        urls = self.spec.prefill_urls + self.spec.decode_urls
        # The native router picks the decode worker: count the stream on every one of the model
        # (exact with one decode worker; with more it keeps warm-ups back a little too often).
        stream = self._decoding(
            _releasing(stream, held), self.spec.decode_urls, ("router", "native"), object()
        )
        return PDCall(body[P.RID], stream, urls, held)

    def dual(self, body: dict, target: PrefillTarget) -> PDCall:
        """An agent's PD request: the same JSON to the target's prefill worker and to a
        decode worker, joined by a fresh bootstrap room on the target's DP rank."""
        claim = self._load["decode"].choose()
        # Released when the stream ends, or by `unpin` if it never ran.
        target.claims["decode"] = claim
        decode = claim.index
        decode_url = self.spec.decode_urls[decode]
        body = {
            **self._with_priority(body, True, target.question),
            P.BOOTSTRAP_HOST: target.host,
            P.BOOTSTRAP_PORT: target.bootstrap_port,
            P.BOOTSTRAP_ROOM: self._room(target),
        }
        held = hold([self.gate(target)])
        # The stream fills `reply` in place once the prefill worker replied.
        reply = PrefillReply()
        stream = self._decoding(
            self._dual_stream(body, target, decode_url, reply, held),
            [decode_url],
            ("decode", decode),
            target.question if target.question is not None else object(),
            claim,
        )
        return PDCall(body[P.RID], stream, [target.url, decode_url], held, reply)

    async def _dual_stream(
        self,
        body: dict,
        target: PrefillTarget,
        decode_url: str,
        reply: PrefillReply,
        held: CriticalHold,
    ) -> AsyncIterator[dict]:
        prefill_url = target.url
        # Counted from here, not at dual(): a stream never iterated never reaches its finally.
        load = self._metrics.worker_load(self.name, "prefill", target.index)
        prefill = asyncio.ensure_future(
            self._client.post_json(f"{prefill_url}/generate", body, "prefill", self._t.read_s)
        )
        decode = self._client.stream(f"{decode_url}/generate", body, "decode").__aiter__()
        nxt: asyncio.Future | None = None
        try:
            while True:
                nxt = nxt or asyncio.ensure_future(decode.__anext__())
                await asyncio.wait(
                    {nxt, prefill} if not prefill.done() else {nxt},
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if prefill.done() and reply.at is None:
                    held.release()  # the prefill worker replied: its part is over
                    load.end()
                    _release_prefill(target)
                    # A failed prefill leaves decode waiting for KV that never comes: fail now.
                    if prefill.exception() is not None:
                        raise prefill.exception()
                    reply.meta.update(prefill.result().get(P.META_INFO, {}))
                    reply.at = time.perf_counter()
                if not nxt.done():
                    continue
                try:
                    chunk = nxt.result()
                except StopAsyncIteration:
                    break
                nxt = None
                yield chunk
            if reply.at is None:
                result = await asyncio.wait_for(prefill, self._t.read_s)
                reply.meta.update(result.get(P.META_INFO, {}))
                reply.at = time.perf_counter()
        finally:
            held.release()
            load.end()
            _release_prefill(target)
            pending = [f for f in (nxt, prefill) if f is not None and not f.done()]
            for fut in pending:
                fut.cancel()
            if pending:
                # The generator must stop running before it can be closed.
                await asyncio.wait(pending)
            await decode.aclose()

    async def _decoding(
        self,
        stream: AsyncIterator[dict],
        decode_urls: list[str],
        worker: tuple[str, int | str],
        question: object,
        claim: Claim | None = None,
    ) -> AsyncIterator[dict]:
        """`stream`, with its decode worker(s) counted busy on their device while it is open
        (as `question`'s, and every chunk timed there: router/decode_slowdown.py), and in flight
        on `worker` ((role, replica) in the metrics) until it ends; `claim`, its open request
        on its decode worker, released then."""
        load = self._metrics.worker_load(self.name, *worker)
        devices = [(u, self._decode_devices[u]) for u in decode_urls if u in self._decode_devices]
        key = object()  # this stream, to the devices' slowdown meters
        meters = list({id(d): d for _, d in devices}.values())  # each device once
        for url, device in devices:
            device.decode_started(url, question)
        try:
            async for chunk in stream:
                for device in meters:
                    device.decode_chunk(key)
                yield chunk
        finally:
            load.end()
            if claim is not None:
                claim.release()
            for url, device in devices:
                device.decode_ended(url, question, key)
            await stream.aclose()

    async def abort(self, call: PDCall) -> None:
        call.hold.release()
        # A worker known to be down would only hold the failing session for abort_s.
        await asyncio.gather(
            *(
                self._client.abort(u, call.rid, self._t.abort_s)
                for u in call.abort_urls
                if not self._is_down(u)
            )
        )

    async def abort_warmup(self, target: PrefillTarget, rid: str) -> None:
        if not self._is_down(target.url):
            await self._client.abort(target.url, rid, self._t.abort_s)


def _release_prefill(target: PrefillTarget) -> None:
    """The target's final prefill is over: its open request on its prefill worker too."""
    if (claim := target.claims.get("prefill")) is not None:
        claim.release()


async def _releasing(stream: AsyncIterator[dict], held: CriticalHold) -> AsyncIterator[dict]:
    """`stream`, releasing `held` at its first chunk (the prefill is over) or when it ends."""
    try:
        async for chunk in stream:
            held.release()
            yield chunk
    finally:
        held.release()
