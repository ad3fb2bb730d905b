"""The /prefill_only verb as plain data: body -> fake-host generate body -> reply, and serve()."""

from __future__ import annotations

import pytest

from sglang_ext import protocol as P
from sglang_ext.prefill_only import (
    PrefillOnlyReplyError,
    PrefillOnlyRequestError,
    serve,
    to_generate_request,
    to_prefill_only_reply,
)


def test_input_ids_become_a_fake_host_warmup():
    req = to_generate_request({"input_ids": [5, 6, 7], "rid": "agent-3"})
    assert req[P.INPUT_IDS] == [5, 6, 7]
    assert req[P.RID] == P.WARMUP_RID_PREFIX + "agent-3"
    assert req[P.BOOTSTRAP_HOST] == P.FAKE_BOOTSTRAP_HOST
    assert req[P.SAMPLING_PARAMS] == {P.MAX_NEW_TOKENS: 1}
    assert req[P.STREAM] is False
    assert 0 <= req[P.BOOTSTRAP_ROOM] <= P.MAX_BOOTSTRAP_ROOM
    assert P.ROUTED_DP_RANK not in req and P.TEXT not in req


def test_given_room_rank_and_prefixed_rid_are_kept():
    rid = P.WARMUP_RID_PREFIX + "x"
    req = to_generate_request(
        {"text": "hi", "rid": rid, "bootstrap_room": 42, "routed_dp_rank": 1, "priority": 0}
    )
    assert req[P.PRIORITY] == 0  # the router's warm-up priority reaches SGLang's scheduler
    assert req[P.RID] == rid  # not prefixed twice
    assert req[P.TEXT] == "hi"
    assert req[P.BOOTSTRAP_ROOM] == 42
    assert req[P.ROUTED_DP_RANK] == 1


def test_missing_rid_gets_a_fresh_warmup_rid_and_fresh_rooms():
    a, b = to_generate_request({"input_ids": [1]}), to_generate_request({"input_ids": [1]})
    assert a[P.RID].startswith(P.WARMUP_RID_PREFIX) and a[P.RID] != b[P.RID]
    assert a[P.BOOTSTRAP_ROOM] != b[P.BOOTSTRAP_ROOM]


def test_the_input_body_is_not_mutated():
    body = {"input_ids": [1, 2], "rid": "r"}
    to_generate_request(body)
    assert body == {"input_ids": [1, 2], "rid": "r"}


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"rid": "r"}, "exactly one"),
        ({"input_ids": [1], "text": "a"}, "exactly one"),
        ({"input_ids": []}, "non-empty list"),
        ({"input_ids": [1, -2]}, "non-negative"),
        ({"input_ids": [True, 2]}, "non-negative ints"),
        ({"input_ids": [[1, 2]]}, "batches"),
        ({"text": ""}, "non-empty string"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": 4}}, "does not accept"),
        ({"input_ids": [1], "bootstrap_room": -1}, "bootstrap_room"),
        ({"input_ids": [1], "bootstrap_room": 2**63}, "bootstrap_room"),
        ({"input_ids": [1], "bootstrap_room": True}, "bootstrap_room"),
        ({"input_ids": [1], "routed_dp_rank": -1}, "routed_dp_rank"),
        ({"input_ids": [1], "rid": 7}, "rid"),
        ({"input_ids": [1], "priority": "high"}, "priority"),
        (["not", "a", "dict"], "JSON object"),
    ],
)
def test_bad_bodies_are_refused_with_a_message(body, needle):
    with pytest.raises(PrefillOnlyRequestError, match=needle):
        to_generate_request(body)
    assert issubclass(PrefillOnlyRequestError, ValueError)


def _reply(**meta):
    base = {
        P.META_ID: "moa-warm-r",
        P.PROMPT_TOKENS: 400,
        P.CACHED_TOKENS: 384,
        P.FINISH_REASON: {"type": "length", "length": 0},
    }
    return {P.OUTPUT_IDS: [11], P.META_INFO: {**base, **meta}}


def test_reply_is_condensed():
    out = to_prefill_only_reply(_reply(e2e_latency=0.25), elapsed_s=0.3)
    assert out == {
        P.RID: "moa-warm-r",
        P.PROMPT_TOKENS: 400,
        P.CACHED_TOKENS: 384,
        P.E2E_LATENCY: 0.25,
        P.ELAPSED_S: 0.3,
    }


def test_reply_without_e2e_latency_uses_elapsed_and_one_element_list_is_unwrapped():
    out = to_prefill_only_reply([_reply()], elapsed_s=0.5)
    assert out[P.E2E_LATENCY] == 0.5 and out[P.CACHED_TOKENS] == 384


@pytest.mark.parametrize(
    ("reply", "needle"),
    [
        ({"text": "no meta"}, "meta_info"),
        (_reply(finish_reason={"type": "abort", "message": "oom"}), "aborted.*oom"),
        ({P.META_INFO: {P.META_ID: "r"}}, "lacks"),
    ],
)
def test_bad_replies_raise(reply, needle):
    with pytest.raises(PrefillOnlyReplyError, match=needle):
        to_prefill_only_reply(reply, 0.1)


async def test_serve_calls_generate_once_and_condenses():
    sent = []

    async def generate(req):
        sent.append(req)
        return 200, _reply(**{P.META_ID: req[P.RID]})

    status, body = await serve(
        {"input_ids": [1, 2, 3], "rid": "a", "routed_dp_rank": 2},
        generate,
        dp_rank_field="data_parallel_rank",
    )
    assert status == 200 and body[P.RID] == P.WARMUP_RID_PREFIX + "a"
    assert body[P.ELAPSED_S] >= 0
    # SGLang < 0.5.11 spells the DP pin "data_parallel_rank".
    assert sent[0]["data_parallel_rank"] == 2 and P.ROUTED_DP_RANK not in sent[0]


async def test_serve_refuses_bad_bodies_without_calling_generate():
    async def generate(req):  # pragma: no cover - must not run
        raise AssertionError("generate called for an invalid body")

    status, body = await serve({"text": 3}, generate)
    assert status == 400 and "non-empty string" in body["error"]["message"]


async def test_serve_passes_backend_errors_through_and_flags_bad_replies():
    async def failing(req):
        return 503, P.error_body("overloaded", 503)

    async def garbage(req):
        return 200, {"unexpected": True}

    async def text_error(req):
        return 502, "upstream died"

    assert await serve({"input_ids": [1]}, failing) == (503, P.error_body("overloaded", 503))
    status, body = await serve({"input_ids": [1]}, garbage)
    assert status == 500 and "meta_info" in body["message"]
    status, body = await serve({"input_ids": [1]}, text_error)
    assert status == 502 and "upstream died" in body["message"]
