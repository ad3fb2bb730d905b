"""The `/prefill_only` verb as plain data: request body -> fake-host `/generate` body -> reply.

Stdlib only. Both backends' routes call it (the reference engine's server and the route the
real-SGLang patch mounts), so the verb means the same thing everywhere.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable

from sglang_ext import protocol as P

# (status, JSON body) of one /generate call, however the backend makes it.
GenerateCall = Callable[[dict], Awaitable[tuple[int, object]]]

# The keys a /prefill_only body may carry; anything else is a typo or a misunderstanding of the verb
# (sampling, streaming and bootstrap host are fixed by what a warm-up is), so it is refused.
# `priority` is passed on: the router sends it on warm-ups when the workers schedule by priority.
ALLOWED_KEYS = (P.INPUT_IDS, P.TEXT, P.RID, P.BOOTSTRAP_ROOM, P.ROUTED_DP_RANK, P.PRIORITY)


class PrefillOnlyRequestError(ValueError):
    """A /prefill_only body that cannot be served; the message says what to change (HTTP 400)."""


class PrefillOnlyReplyError(RuntimeError):
    """The generate call behind /prefill_only answered without the fields a warm-up reports."""


def _is_int(value: object) -> bool:
    # bool is an int subclass; `true` as a token id or room is always a client bug.
    return isinstance(value, int) and not isinstance(value, bool)


def _check_prompt(body: dict) -> dict:
    has_ids, has_text = P.INPUT_IDS in body, P.TEXT in body
    if has_ids == has_text:
        raise PrefillOnlyRequestError(
            f"/prefill_only needs exactly one of '{P.INPUT_IDS}' (list of token ids) or "
            f"'{P.TEXT}' (string); got {'both' if has_ids else 'neither'}"
        )
    if has_ids:
        ids = body[P.INPUT_IDS]
        if not isinstance(ids, list) or not ids or not all(_is_int(t) and t >= 0 for t in ids):
            raise PrefillOnlyRequestError(
                f"'{P.INPUT_IDS}' must be a non-empty list of non-negative ints (one prompt; "
                "batches are not supported by /prefill_only)"
            )
        return {P.INPUT_IDS: list(ids)}
    text = body[P.TEXT]
    if not isinstance(text, str) or not text:
        raise PrefillOnlyRequestError(f"'{P.TEXT}' must be a non-empty string")
    return {P.TEXT: text}


def _warmup_rid(rid: object) -> str:
    if rid is None:
        return f"{P.WARMUP_RID_PREFIX}{uuid.uuid4().hex}"
    if not isinstance(rid, str) or not rid:
        raise PrefillOnlyRequestError(f"'{P.RID}' must be a non-empty string when given")
    # The prefix is what the 0.5.11+ patch keys radix insertion on: every warm-up must carry it.
    return rid if rid.startswith(P.WARMUP_RID_PREFIX) else f"{P.WARMUP_RID_PREFIX}{rid}"


def to_generate_request(body: dict) -> dict:
    """Translate a /prefill_only body into the fake-host /generate body a PD prefill worker takes.

    Raises PrefillOnlyRequestError for a body that is not a dict, has unknown keys, or bad values.
    """
    if not isinstance(body, dict):
        raise PrefillOnlyRequestError("/prefill_only body must be a JSON object")
    unknown = sorted(set(body) - set(ALLOWED_KEYS))
    if unknown:
        raise PrefillOnlyRequestError(
            f"/prefill_only does not accept {unknown}; allowed keys: {list(ALLOWED_KEYS)} "
            "(sampling, stream and bootstrap host are fixed for a warm-up)"
        )
    req = _check_prompt(body)
    room = body.get(P.BOOTSTRAP_ROOM)
    if room is not None and not (_is_int(room) and 0 <= room <= P.MAX_BOOTSTRAP_ROOM):
        raise PrefillOnlyRequestError(
            f"'{P.BOOTSTRAP_ROOM}' must be an int in [0, 2**63-1]; pick it so that "
            "room % dp_size is the DP rank the later full request will use"
        )
    dp_rank = body.get(P.ROUTED_DP_RANK)
    if dp_rank is not None and not (_is_int(dp_rank) and dp_rank >= 0):
        raise PrefillOnlyRequestError(f"'{P.ROUTED_DP_RANK}' must be a non-negative int")
    priority = body.get(P.PRIORITY)
    if priority is not None and not _is_int(priority):
        raise PrefillOnlyRequestError(f"'{P.PRIORITY}' must be an int (SGLang's priority field)")
    req.update(
        {
            P.RID: _warmup_rid(body.get(P.RID)),
            P.SAMPLING_PARAMS: {P.MAX_NEW_TOKENS: 1},
            P.STREAM: False,
            P.BOOTSTRAP_HOST: P.FAKE_BOOTSTRAP_HOST,
            P.BOOTSTRAP_ROOM: room if room is not None else P.new_bootstrap_room(),
        }
    )
    if dp_rank is not None:
        req[P.ROUTED_DP_RANK] = dp_rank
    if priority is not None:
        req[P.PRIORITY] = priority
    return req


def to_prefill_only_reply(generate_reply: dict, elapsed_s: float) -> dict:
    """Condense a non-streamed /generate reply into {rid, prompt_tokens, cached_tokens, ...}.

    `elapsed_s` is the wall time the caller measured around the generate call; e2e_latency falls
    back to it when the server reports none. Raises PrefillOnlyReplyError for an aborted or
    malformed reply.
    """
    if isinstance(generate_reply, list) and len(generate_reply) == 1:
        generate_reply = generate_reply[0]  # SGLang answers a one-element batch with a list
    meta = generate_reply.get(P.META_INFO) if isinstance(generate_reply, dict) else None
    if not isinstance(meta, dict):
        raise PrefillOnlyReplyError(f"generate reply has no '{P.META_INFO}': {generate_reply!r}")
    finish = meta.get(P.FINISH_REASON)
    if isinstance(finish, dict) and finish.get("type") == P.FINISH_ABORT:
        raise PrefillOnlyReplyError(f"warm-up aborted by the server: {finish.get('message')}")
    missing = [k for k in (P.META_ID, P.PROMPT_TOKENS, P.CACHED_TOKENS) if k not in meta]
    if missing:
        raise PrefillOnlyReplyError(f"generate reply meta_info lacks {missing}: {meta!r}")
    e2e = meta.get(P.E2E_LATENCY)
    return {
        P.RID: meta[P.META_ID],
        P.PROMPT_TOKENS: int(meta[P.PROMPT_TOKENS]),
        P.CACHED_TOKENS: int(meta[P.CACHED_TOKENS]),
        P.E2E_LATENCY: float(e2e) if e2e is not None else float(elapsed_s),
        P.ELAPSED_S: float(elapsed_s),
    }


async def serve(
    body: object, generate: GenerateCall, dp_rank_field: str = P.ROUTED_DP_RANK
) -> tuple[int, dict]:
    """The whole verb: validate, call `generate` once, condense; returns (HTTP status, JSON body).

    `dp_rank_field` is the generate key that pins a DP rank on the serving backend (SGLang before
    0.5.11 calls it "data_parallel_rank"). Errors come back as SGLang-style JSON error bodies.
    """
    try:
        req = to_generate_request(body)  # type: ignore[arg-type]
    except PrefillOnlyRequestError as e:
        return 400, P.error_body(str(e), 400)
    if P.ROUTED_DP_RANK in req and dp_rank_field != P.ROUTED_DP_RANK:
        req[dp_rank_field] = req.pop(P.ROUTED_DP_RANK)
    start = time.perf_counter()
    status, reply = await generate(req)
    elapsed = time.perf_counter() - start
    if status != 200:
        # Pass the backend's own error through: it names the real cause (bad room, overload...).
        if isinstance(reply, dict):
            return status, reply
        return status, P.error_body(f"warm-up generate failed: {reply}", status)
    try:
        return 200, to_prefill_only_reply(reply, elapsed)  # type: ignore[arg-type]
    except PrefillOnlyReplyError as e:
        return 500, P.error_body(str(e), 500)
