"""One model's PD deployment as the shell router uses it: warm-ups straight to a prefill worker,
the final PD request of a successor sent by us to a sticky (prefill worker, DP rank) plus a decode
worker, and first-layer requests through the model's native sglang-router.

Why we dispatch successors' final requests ourselves rather than through sglang-router 0.3.2:
the router picks the prefill worker by its own policy (pinning needs `--policy manual` plus a
header on every request, which the launcher would have to configure), and it drains the prefill
reply, so `cached_tokens` as the prefill worker saw it is lost (sglang-notes fact 7). Sending the
same JSON to both workers with the bootstrap fields is the router's whole job (fact 6), a few
lines here, and gives stickiness and the true `cached_tokens` on any router policy.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlparse

from router.cluster import ModelDeployment, Timeouts
from router.sglang_client import SGLangClient
from sglang_ext import protocol as P


@dataclass(frozen=True, slots=True)
class PrefillTarget:
    """Where every warm-up and the final request of one successor go."""

    index: int
    url: str
    bootstrap_port: int | None
    dp_rank: int
    dp_size: int

    @property
    def host(self) -> str:
        return urlparse(self.url).hostname or "127.0.0.1"


@dataclass(slots=True)
class PDCall:
    """One streamed generate request; after the stream ends `prefill_meta` holds the prefill
    worker's meta_info when we dispatched to both workers ourselves."""

    rid: str
    stream: AsyncIterator[dict]
    abort_urls: list[str]
    prefill_meta: dict = field(default_factory=dict)


class Deployment:
    def __init__(
        self,
        name: str,
        spec: ModelDeployment,
        client: SGLangClient,
        timeouts: Timeouts,
        warmup_verb: str,
        rng: random.Random | None = None,
    ) -> None:
        self.name, self.spec, self._client, self._t = name, spec, client, timeouts
        self._warmup_verb = warmup_verb
        self._rng = rng or random.Random()
        self._decode_rr = itertools.cycle(range(len(spec.decode_urls)))
        slots = [(i, r) for i in range(len(spec.prefill_urls)) for r in range(spec.prefill_dp_size)]
        # Successors currently pinned to each (prefill worker, DP rank).
        self._pinned = {s: 0 for s in slots}
        self._pick_rr = itertools.count()

    # --- stickiness ---------------------------------------------------------------------------
    def pick_prefill(self) -> PrefillTarget:
        """The least-pinned (prefill worker, DP rank); ties rotate. Release it with `unpin`."""
        n = next(self._pick_rr)
        keys = list(self._pinned)
        order = keys[n % len(keys) :] + keys[: n % len(keys)]
        index, rank = min(order, key=lambda k: self._pinned[k])
        self._pinned[(index, rank)] += 1
        return PrefillTarget(
            index,
            self.spec.prefill_urls[index],
            self.spec.bootstrap_port(index),
            rank,
            self.spec.prefill_dp_size,
        )

    def unpin(self, target: PrefillTarget) -> None:
        self._pinned[(target.index, target.dp_rank)] -= 1

    def _room(self, target: PrefillTarget) -> int:
        return P.new_bootstrap_room(target.dp_rank, target.dp_size, self._rng)

    # --- requests -----------------------------------------------------------------------------
    async def warmup(self, target: PrefillTarget, input_ids: list[int], rid: str) -> dict:
        """Prefill `input_ids` into the target's radix cache; nothing goes to decode.
        Returns the reply's meta_info (prompt_tokens, cached_tokens)."""
        if self._warmup_verb == "prefill_only":
            # The room pins the DP rank (room % dp_size), as on the final request: without it
            # the verb draws a random room and the warm-up may fill another rank's cache.
            reply = await self._client.post_json(
                f"{target.url}{P.PREFILL_ONLY_PATH}",
                {P.INPUT_IDS: input_ids, P.RID: rid, P.BOOTSTRAP_ROOM: self._room(target)},
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
            f"{target.url}/generate", body, "warm-up", self._t.warmup_s
        )
        return reply.get(P.META_INFO, {})

    def via_router(self, body: dict) -> PDCall:
        """A first-layer request through the native sglang-router (it picks the pair)."""
        rid = body[P.RID]
        stream = self._client.stream(f"{self.spec.router_url}/generate", body, "router")
        return PDCall(rid, stream, self.spec.prefill_urls + self.spec.decode_urls)

    def dual(self, body: dict, target: PrefillTarget) -> PDCall:
        """The final PD request of a successor: the same JSON to its prefill worker and to a
        decode worker, joined by a fresh bootstrap room on the target's DP rank."""
        decode_url = self.spec.decode_urls[next(self._decode_rr)]
        body = {
            **body,
            P.BOOTSTRAP_HOST: target.host,
            P.BOOTSTRAP_PORT: target.bootstrap_port,
            P.BOOTSTRAP_ROOM: self._room(target),
        }
        # The stream fills `prefill_meta` in place once the prefill worker replied.
        prefill_meta: dict = {}
        stream = self._dual_stream(body, target.url, decode_url, prefill_meta)
        return PDCall(body[P.RID], stream, [target.url, decode_url], prefill_meta)

    async def _dual_stream(
        self, body: dict, prefill_url: str, decode_url: str, prefill_meta: dict
    ) -> AsyncIterator[dict]:
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
                # A failed prefill leaves decode waiting for KV that never comes: fail now.
                if prefill.done() and prefill.exception() is not None:
                    raise prefill.exception()
                if not nxt.done():
                    continue
                try:
                    chunk = nxt.result()
                except StopAsyncIteration:
                    break
                nxt = None
                yield chunk
            reply = await asyncio.wait_for(prefill, self._t.read_s)
            prefill_meta.update(reply.get(P.META_INFO, {}))
        finally:
            pending = [f for f in (nxt, prefill) if f is not None and not f.done()]
            for fut in pending:
                fut.cancel()
            if pending:
                # The generator must stop running before it can be closed.
                await asyncio.wait(pending)
            await decode.aclose()

    async def abort(self, call: PDCall) -> None:
        await asyncio.gather(
            *(self._client.abort(u, call.rid, self._t.abort_s) for u in call.abort_urls)
        )

    async def abort_warmup(self, target: PrefillTarget, rid: str) -> None:
        await self._client.abort(target.url, rid, self._t.abort_s)
