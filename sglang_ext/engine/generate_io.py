"""/generate in SGLang's shapes: request body → `Req` (with every validation a 400 names), and
OutputChunks → reply JSON / SSE chunk JSON. Called by `server.py` and `openai_api.py`.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from sglang_ext import protocol as P
from sglang_ext.engine.config import EngineConfig
from sglang_ext.engine.request import BadRequestError, OutputChunk, Req, SamplingParams
from sglang_ext.engine.time_stats import ReqTimeStats

MAX_TOP_LOGPROBS = 20


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _prompt_ids(body: dict, tokenizer, vocab_size: int) -> list[int]:
    has_text, has_ids = body.get(P.TEXT) is not None, body.get(P.INPUT_IDS) is not None
    if has_text and has_ids:
        raise BadRequestError("Either text or input_ids should be provided, not both")
    if not has_text and not has_ids:
        raise BadRequestError("no prompt: give 'text' (a string) or 'input_ids' (a list of ints)")
    if has_text:
        text = body[P.TEXT]
        if not isinstance(text, str):
            raise BadRequestError(
                "'text' must be one string (batched requests are not supported: "
                "send one request per prompt)"
            )
        if tokenizer is None:
            raise BadRequestError("this worker runs with --skip-tokenizer-init: send 'input_ids'")
        ids = tokenizer(text)["input_ids"]
    else:
        ids = body[P.INPUT_IDS]
        if not isinstance(ids, list) or not all(_is_int(t) for t in ids):
            raise BadRequestError(
                "'input_ids' must be one list of ints (batched requests are not "
                "supported: send one request per prompt)"
            )
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise BadRequestError(f"token id(s) {bad[:5]} out of vocabulary [0, {vocab_size})")
    if not ids:
        raise BadRequestError("the prompt is empty")
    return list(ids)


def _check_bootstrap(body: dict, cfg: EngineConfig) -> None:
    host, port, room = (
        body.get(P.BOOTSTRAP_HOST),
        body.get(P.BOOTSTRAP_PORT),
        body.get(P.BOOTSTRAP_ROOM),
    )
    if room is None:
        raise BadRequestError(
            "Disaggregated request received without bootstrap room id "
            f"('{P.BOOTSTRAP_ROOM}'): send PD requests through the router"
        )
    if not _is_int(room) or not 0 <= room <= P.MAX_BOOTSTRAP_ROOM:
        raise BadRequestError(f"'{P.BOOTSTRAP_ROOM}' must be an int in [0, 2**63-1], got {room!r}")
    if not isinstance(host, str) or not host:
        raise BadRequestError(f"'{P.BOOTSTRAP_HOST}' must be the prefill worker's host")
    if port is not None and not (_is_int(port) and 0 < port < 65536):
        raise BadRequestError(f"'{P.BOOTSTRAP_PORT}' must be a port number or null, got {port!r}")
    if cfg.mode == "decode" and host == P.FAKE_BOOTSTRAP_HOST:
        raise BadRequestError(
            f"bootstrap_host {P.FAKE_BOOTSTRAP_HOST} marks a prefill-only warm-up: "
            "send it to a prefill worker, not to decode"
        )


def parse_generate(body, cfg: EngineConfig, tokenizer) -> tuple[Req, bool]:
    """Validate a /generate body; returns the Req (no callback yet) and whether to stream."""
    received = ReqTimeStats.now()
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    ids = _prompt_ids(body, tokenizer, cfg.vocab_size)
    sp = SamplingParams.from_dict(body.get(P.SAMPLING_PARAMS), cfg.vocab_size)
    if sp.stop and tokenizer is None:
        raise BadRequestError(
            "'stop' strings need the tokenizer (worker runs --skip-tokenizer-init)"
        )
    if len(ids) >= cfg.context_length:
        raise BadRequestError(
            f"The input ({len(ids)} tokens) is longer than the model's context "
            f"length ({cfg.context_length} tokens)."
        )
    if cfg.mode != "null":
        _check_bootstrap(body, cfg)
        if cfg.mode == "prefill":
            sp.max_new_tokens = 1  # as SGLang: prefill makes exactly the first token
    if len(ids) + sp.max_new_tokens > cfg.context_length:
        raise BadRequestError(
            f"Requested token count exceeds the model's maximum context length of "
            f"{cfg.context_length} tokens: {len(ids)} prompt tokens + max_new_tokens "
            f"{sp.max_new_tokens}; lower max_new_tokens"
        )
    rid = body.get(P.RID)
    if rid is not None and (not isinstance(rid, str) or not rid):
        raise BadRequestError("'rid' must be a non-empty string (batched rids are not supported)")
    k = body.get(P.TOP_LOGPROBS_NUM) or 0
    if not _is_int(k) or not 0 <= k <= MAX_TOP_LOGPROBS:
        raise BadRequestError(f"'top_logprobs_num' must be an int in [0, {MAX_TOP_LOGPROBS}]")
    stream = body.get(P.STREAM, False)
    if not isinstance(stream, bool):
        raise BadRequestError("'stream' must be true or false")
    priority = body.get(P.PRIORITY)
    if priority is not None and not _is_int(priority):
        raise BadRequestError(f"'{P.PRIORITY}' must be an integer or null, got {priority!r}")
    req = Req(
        rid=rid or uuid.uuid4().hex,
        input_ids=ids,
        sampling=sp,
        return_logprob=bool(body.get(P.RETURN_LOGPROB, False)),
        top_logprobs_num=k,
        bootstrap_host=body.get(P.BOOTSTRAP_HOST),
        bootstrap_port=body.get(P.BOOTSTRAP_PORT),
        bootstrap_room=body.get(P.BOOTSTRAP_ROOM),
        eos_token_ids=cfg.eos_token_ids,
        priority=priority,
    )
    req.time_stats.created_time = received
    return req, stream


@dataclass
class ReplyBuilder:
    """Accumulates a request's OutputChunks and renders SGLang's reply and stream chunks."""

    req: Req
    tokenizer: object
    text_in_logprobs: bool = False
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[list] = field(default_factory=list)
    top_logprobs: list[list] = field(default_factory=list)
    last: OutputChunk | None = None
    start: float = field(default_factory=time.monotonic)
    sent_ids: int = 0
    sent_lps: int = 0

    def add(self, chunk: OutputChunk) -> None:
        self.last = chunk
        ts = self.req.time_stats
        if chunk.new_ids and ts.first_token_time == 0:
            ts.first_token_time = ReqTimeStats.now()
        if chunk.finished:
            ts.finished_time = ReqTimeStats.now()
        self.output_ids.extend(chunk.new_ids)
        if self.req.return_logprob:
            for lp, tok, top in zip(chunk.new_logprobs, chunk.new_ids, chunk.new_top_logprobs):
                self.logprobs.append([lp, tok, self._tok_text(tok)])
                self.top_logprobs.append([[v, t, self._tok_text(t)] for v, t in top])

    def _tok_text(self, tok: int) -> str | None:
        if not self.text_in_logprobs or self.tokenizer is None:
            return None
        return self.tokenizer.decode([tok])

    def text(self, final: bool) -> str:
        if self.tokenizer is None:
            return ""
        ids, fr = self.output_ids, self.last.finish_reason if self.last else None
        sp = self.req.sampling
        if (
            fr
            and fr.get("type") == P.FINISH_STOP
            and _is_int(fr.get("matched"))
            and not sp.no_stop_trim
            and ids
        ):
            ids = ids[:-1]  # SGLang leaves the matched stop token out of the text
        text = self.tokenizer.decode(ids, skip_special_tokens=sp.skip_special_tokens)
        if (
            fr
            and fr.get("type") == P.FINISH_STOP
            and isinstance(fr.get("matched"), str)
            and not sp.no_stop_trim
        ):
            cut = text.find(fr["matched"])
            text = text[:cut] if cut >= 0 else text
        if not final and text.endswith("\ufffd"):
            text = text.rstrip("\ufffd")  # an incomplete UTF-8 sequence: wait for the next token
        return text

    def meta(self, incremental: bool) -> dict:
        c = self.last
        m = {
            P.META_ID: self.req.rid,
            P.FINISH_REASON: c.finish_reason if c else None,
            P.PROMPT_TOKENS: self.req.prompt_len,
            P.COMPLETION_TOKENS: len(self.output_ids),
            P.CACHED_TOKENS: c.cached_tokens if c else 0,
            P.WEIGHT_VERSION: "default",
        }
        if self.req.return_logprob:
            a = self.sent_lps if incremental else 0
            m[P.OUTPUT_TOKEN_LOGPROBS] = self.logprobs[a:]
            m[P.OUTPUT_TOP_LOGPROBS] = self.top_logprobs[a:] if self.req.top_logprobs_num else []
            m[P.INPUT_TOKEN_LOGPROBS] = []  # input logprobs are not computed by this backend
            m[P.INPUT_TOP_LOGPROBS] = []
            if incremental:
                self.sent_lps = len(self.logprobs)
        m.update(self.req.time_stats.scheduler_meta())
        if c is not None and c.finished:
            m[P.E2E_LATENCY] = time.monotonic() - self.start
            m.update(self.req.time_stats.finished_meta(len(self.output_ids)))
        return m

    def reply(self) -> dict:
        meta = self.meta(incremental=False)
        meta.update(self.req.time_stats.response_sent_meta())
        return {
            P.TEXT: self.text(final=True),
            P.OUTPUT_IDS: list(self.output_ids),
            P.META_INFO: meta,
        }

    def stream_chunk(self) -> dict:
        """Cumulative text, new output_ids and logprobs since the previous chunk (SGLang 0.5)."""
        final = bool(self.last and self.last.finished)
        new_ids = self.output_ids[self.sent_ids :]
        self.sent_ids = len(self.output_ids)
        meta = self.meta(incremental=True)
        if self.req.time_stats.response_sent_to_client_time == 0:  # the stream's first chunk
            meta.update(self.req.time_stats.response_sent_meta())
        return {
            P.TEXT: self.text(final),
            P.OUTPUT_IDS: new_ids,
            P.META_INFO: meta,
        }
