"""Test doubles for the shell router's tests: fake SGLang workers (prefill, decode, and a native
router the cluster file names but the shell router does not call) that speak the wire protocol with a deterministic "model", a fake radix cache and request
bookkeeping; fixtures for the SmolLM2 tokenizer and a fake cluster. No torch, no processes."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections import OrderedDict
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from router.cluster import ClusterSpec, Timeouts
from sglang_ext import protocol as P

VOCAB_LO, VOCAB_HI = 200, 20000  # plain word pieces of SmolLM2's vocab; no special tokens


def fake_output(prompt: list[int], n: int) -> list[int]:
    """The fake model's greedy output: a pure function of the prompt."""
    seed = hashlib.sha1(str(prompt).encode()).digest()
    base = int.from_bytes(seed[:4], "little")
    return [VOCAB_LO + (base + 7919 * i * i + 31 * i) % (VOCAB_HI - VOCAB_LO) for i in range(n)]


@dataclass
class FakeWorker:
    role: str  # "prefill" | "decode" | "router"
    token_delay_s: float = 0.0
    # Prefill cost per token not found in the cache.
    prefill_s_per_token: float = 0.0
    hang: bool = False
    fail_rids_containing: str | None = None
    fail_status: int = 500
    max_cache_entries: int = 64
    # Data-parallel ranks of a prefill worker, each with its own radix cache; a request goes to
    # rank bootstrap_room % dp_size (as in SGLang), one without a room to the next rank in turn.
    dp_size: int = 1
    # Token delay of the requests whose rid contains a key (first match), else token_delay_s.
    delay_by_rid: dict[str, float] = field(default_factory=dict)
    # Stream as real SGLang does with --skip-tokenizer-init: every id so far in each chunk, and
    # no text.
    cumulative_ids: bool = False
    # Every chunk's text but the last ends in U+FFFD, as when a token holds half a character.
    half_characters: bool = False
    # Shared by one cluster's workers: bootstrap room -> host of the prefill worker that got a
    # final (non-warm-up) request with it. A decode worker serves only a room some prefill
    # worker got, from the host the request names, as a real KV transfer would.
    rooms: dict[int, str] | None = None
    requests: list[dict] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    active: dict[str, asyncio.Event] = field(default_factory=dict)
    max_concurrent: int = 0
    _caches: dict[int, OrderedDict] = field(default_factory=dict)
    _next_rank: itertools.count = field(default_factory=itertools.count)
    server: TestServer | None = None

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def warmups(self) -> list[dict]:
        return [
            r
            for r in self.requests
            if r.get(P.BOOTSTRAP_HOST) == P.FAKE_BOOTSTRAP_HOST
            or r.get("_path") == P.PREFILL_ONLY_PATH
        ]

    def finals(self) -> list[dict]:
        return [r for r in self.requests if r not in self.warmups()]

    @property
    def host(self) -> str:
        return self.server.host

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/generate", self.generate)
        app.router.add_post(P.PREFILL_ONLY_PATH, self.prefill_only)
        app.router.add_post("/abort_request", self.abort)
        app.router.add_get("/health", self.health)
        return app

    async def start(self) -> FakeWorker:
        self.server = TestServer(self.app())
        await self.server.start_server()
        return self

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    # --- the fake radix cache ----------------------------------------------------------------
    def _rank(self, body: dict) -> int:
        room = body.get(P.BOOTSTRAP_ROOM)
        return (room if room is not None else next(self._next_rank)) % self.dp_size

    def _match_and_insert(self, ids: list[int], rank: int) -> int:
        cache = self._caches.setdefault(rank, OrderedDict())
        best = 0
        for cached in cache:
            n = 0
            for a, b in zip(cached, ids):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        key = tuple(ids)
        cache[key] = True
        cache.move_to_end(key)
        while len(cache) > self.max_cache_entries:
            cache.popitem(last=False)
        # Like SGLang: at least one token is always computed.
        return min(best, len(ids) - 1)

    # --- routes --------------------------------------------------------------------------------
    async def prefill_only(self, request: web.Request) -> web.Response:
        body = await request.json()
        rank = self._rank(body)
        self.requests.append({**body, "_path": P.PREFILL_ONLY_PATH, "_rank": rank})
        if not body.get(P.INPUT_IDS):
            return web.json_response(P.error_body("input_ids must be non-empty", 400), status=400)
        rid = body.get(P.RID, "")
        stop = self.active.setdefault(rid, asyncio.Event())
        try:
            if self.hang:
                await stop.wait()
                return web.json_response({})
            cached = await self._prefill(body[P.INPUT_IDS], rank)
        finally:
            self.active.pop(rid, None)
        return web.json_response(
            {P.RID: rid, P.PROMPT_TOKENS: len(body[P.INPUT_IDS]), P.CACHED_TOKENS: cached}
        )

    async def _prefill(self, ids: list[int], rank: int) -> int:
        cached = self._match_and_insert(ids, rank)
        if self.prefill_s_per_token:
            await asyncio.sleep(self.prefill_s_per_token * (len(ids) - cached))
        return cached

    async def abort(self, request: web.Request) -> web.Response:
        rid = (await request.json()).get(P.RID)
        self.aborted.append(rid)
        if rid in self.active:
            self.active[rid].set()
        return web.json_response({"ok": True})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        rank = self._rank(body) if self.role == "prefill" else 0
        self.requests.append({**body, "_rank": rank} if self.role == "prefill" else body)
        rid = body.get(P.RID, "")
        if self.fail_rids_containing and self.fail_rids_containing in rid:
            return web.json_response(
                P.error_body("injected failure", self.fail_status), status=self.fail_status
            )
        if self.role in ("prefill", "decode") and body.get(P.BOOTSTRAP_ROOM) is None:
            return web.json_response(
                P.error_body("request without bootstrap room id", 400), status=400
            )
        stop = self.active.setdefault(rid, asyncio.Event())
        self.max_concurrent = max(self.max_concurrent, len(self.active))
        try:
            if self.hang:
                await stop.wait()
                return web.json_response({})
            ids = body[P.INPUT_IDS]
            if self.role == "prefill":
                if self.rooms is not None and body.get(P.BOOTSTRAP_HOST) != P.FAKE_BOOTSTRAP_HOST:
                    self.rooms[body[P.BOOTSTRAP_ROOM]] = self.host
                cached = await self._prefill(ids, rank)
                meta = {
                    P.META_ID: rid,
                    P.PROMPT_TOKENS: len(ids),
                    P.CACHED_TOKENS: cached,
                    P.FINISH_REASON: {"type": P.FINISH_LENGTH, "length": 1},
                }
                reply = {P.TEXT: "", P.OUTPUT_IDS: fake_output(ids, 1), P.META_INFO: meta}
                if body.get(P.STREAM):
                    resp = web.StreamResponse(headers={"Content-Type": P.SSE_CONTENT_TYPE})
                    await resp.prepare(request)
                    await resp.write(P.sse_event(reply))
                    await resp.write(P.sse_done())
                    return resp
                return web.json_response(reply)
            return await self._decode(request, body, ids, stop)
        finally:
            self.active.pop(rid, None)

    async def _kv_source_error(self, body: dict) -> str | None:
        """Why a decode request would get no KV from a prefill worker, or None."""
        room = body[P.BOOTSTRAP_ROOM]
        for _ in range(200):  # the prefill request may arrive a little later
            if room in self.rooms:
                break
            await asyncio.sleep(0.01)
        else:
            return f"no prefill worker got a request with bootstrap room {room}"
        if self.rooms[room] != body.get(P.BOOTSTRAP_HOST):
            return (
                f"bootstrap_host {body.get(P.BOOTSTRAP_HOST)} is not the host of the prefill "
                f"worker with room {room} ({self.rooms[room]})"
            )
        return None

    async def _decode(self, request, body, ids, stop: asyncio.Event) -> web.StreamResponse:
        checked = self.role == "decode" and self.rooms is not None
        if checked and (error := await self._kv_source_error(body)) is not None:
            return web.json_response(P.error_body(error, 400), status=400)
        n = body.get(P.SAMPLING_PARAMS, {}).get(P.MAX_NEW_TOKENS, P.DEFAULT_MAX_NEW_TOKENS)
        rid = body.get(P.RID, "")
        delay = next((d for k, d in self.delay_by_rid.items() if k in rid), self.token_delay_s)
        out = fake_output(ids, n)
        resp = web.StreamResponse(headers={"Content-Type": P.SSE_CONTENT_TYPE})
        await resp.prepare(request)
        text = ""
        for i, t in enumerate(out):
            if stop.is_set():
                break
            if delay:
                await asyncio.sleep(delay)
            text += f" w{t}"
            last = i == len(out) - 1
            meta = {
                P.META_ID: rid,
                P.PROMPT_TOKENS: len(ids),
                P.CACHED_TOKENS: 0,
                P.COMPLETION_TOKENS: i + 1,
                P.OUTPUT_TOKEN_LOGPROBS: [[-0.01 * (i % 7), t, None]],
                P.FINISH_REASON: {"type": P.FINISH_LENGTH, "length": n} if last else None,
            }
            if self.cumulative_ids:
                event = {P.OUTPUT_IDS: out[: i + 1], P.META_INFO: meta}
            else:
                shown = text + "\ufffd" if self.half_characters and not last else text
                event = {P.TEXT: shown, P.OUTPUT_IDS: [t], P.META_INFO: meta}
            await resp.write(P.sse_event(event))
        await resp.write(P.sse_done())
        return resp


@dataclass
class FakeCluster:
    spec: ClusterSpec
    prefills: list[FakeWorker]
    decodes: list[FakeWorker]
    router: FakeWorker

    def workers(self) -> list[FakeWorker]:
        return [*self.prefills, *self.decodes, self.router]

    async def close(self) -> None:
        for w in self.workers():
            await w.server.close()


async def start_fake_cluster(
    tokenizer_path: str,
    model: str = "smollm2",
    n_prefill: int = 1,
    n_decode: int = 1,
    timeouts: Timeouts | None = None,
    warmup_verb: str = "generate",
    prefill_dp_size: int = 1,
    **worker_kw,
) -> FakeCluster:
    rooms: dict[int, str] = {}
    prefills = [
        await FakeWorker(
            "prefill", dp_size=prefill_dp_size, rooms=rooms, **worker_kw.get("prefill", {})
        ).start()
        for _ in range(n_prefill)
    ]
    decodes = [
        await FakeWorker("decode", rooms=rooms, **worker_kw.get("decode", {})).start()
        for _ in range(n_decode)
    ]
    router = await FakeWorker("router", **worker_kw.get("router", {})).start()
    spec = ClusterSpec.model_validate(
        {
            "models": {
                model: {
                    "router_url": router.url,
                    "prefill_urls": [p.url for p in prefills],
                    "decode_urls": [d.url for d in decodes],
                    "bootstrap_ports": [None] * n_prefill,
                    "tokenizer_path": tokenizer_path,
                    "prefill_dp_size": prefill_dp_size,
                }
            },
            "timeouts": (
                timeouts or Timeouts(read_s=10, warmup_s=10, precursor_wait_s=20)
            ).model_dump(),
            "warmup_verb": warmup_verb,
        }
    )
    return FakeCluster(spec, prefills, decodes, router)


@pytest.fixture(scope="session")
def smollm_tokenizer_path() -> str:
    """SmolLM2-135M-Instruct's HF directory (converted once from the shipped GGUF)."""
    from sglang_ext.engine.model_store import resolve_model_path

    return resolve_model_path("smollm2-135m")


@pytest.fixture
async def fake_cluster(smollm_tokenizer_path):
    cluster = await start_fake_cluster(smollm_tokenizer_path)
    yield cluster
    await cluster.close()


def tree_config(
    name: str = "tree_3_1_cpu",
    max_new_tokens: int = 8,
    slot_order: str = "template",
    chunk_policy: str = "adaptive",
    chunk_tokens: int = 32,
    incremental: bool = True,
    min_chunk_tokens: int = 4,
    temperature: float = 0.0,
):
    """A shipped CPU tree config with test-sized outputs (every agent's own length budget
    replaced by `max_new_tokens`). With `temperature` > 0 each agent samples with its own
    `sampling_seed`, which both modes must reproduce token for token."""
    from router.config import IncrementalPrefill, Sampling
    from router.config_loader import load_config

    cfg = load_config(name)
    return cfg.model_copy(
        update={
            "sampling": Sampling(max_new_tokens=max_new_tokens, temperature=temperature),
            "agents": [
                a.model_copy(
                    update={
                        "sampling": Sampling(sampling_seed=1000 + i if temperature > 0 else None)
                    }
                )
                for i, a in enumerate(cfg.agents)
            ],
            "slot_order": slot_order,
            "incremental_prefill": IncrementalPrefill(
                enabled=incremental,
                chunk_policy=chunk_policy,
                chunk_tokens=chunk_tokens,
                min_chunk_tokens=min_chunk_tokens,
            ),
        }
    )


def stack_cluster(stack, extra_prefills=(), timeouts: Timeouts | None = None) -> ClusterSpec:
    """A cluster spec over conftest's real stack (plus optional extra prefill workers)."""
    prefills = [stack.prefill, *extra_prefills]
    return ClusterSpec.model_validate(
        {
            "models": {
                "smollm2": {
                    "router_url": stack.router.url,
                    "prefill_urls": [p.url for p in prefills],
                    "decode_urls": [stack.decode.url],
                    "bootstrap_ports": [p.bootstrap_port for p in prefills],
                    "model_path": stack.model_dir,
                    "tokenizer_path": stack.model_dir,
                }
            },
            "timeouts": (
                timeouts or Timeouts(read_s=60, warmup_s=60, precursor_wait_s=120)
            ).model_dump(),
        }
    )
