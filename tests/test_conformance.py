"""One wire-protocol suite, run against the reference engine (`make test`) and against real SGLang
0.5.23 on its CPU path (`make test-sglang`): the fields of /generate requests and meta_info,
logprobs, the stream format as the router reads it, stop reasons, abort, flush_cache and error
replies. What the shell router relies on must hold for both; this keeps the reference honest."""

from __future__ import annotations

import concurrent.futures
import time

import procs
import pytest
import requests

from router.stream_reader import new_ids
from sglang_ext import protocol as P

pytestmark = pytest.mark.slow

CHAT = (
    "<|im_start|>user\nWrite one short sentence about the sea.<|im_end|>\n<|im_start|>assistant\n"
)
ENGINES = ["torch", pytest.param("sglang", marks=pytest.mark.sglang_cpu)]


@pytest.fixture(scope="module", params=ENGINES)
def url(request, smollm2_dir, tmp_path_factory):
    if request.param == "sglang":  # the session's patched SGLang server (sglang_real.py)
        yield request.getfixturevalue("sglang_nulls").get("patched").url
        return
    proc = procs.start_worker(
        "conformance-torch",
        smollm2_dir,
        tmp_path_factory.mktemp(request.param),
        "null",
        ["--max-total-tokens", "4096"],
    )
    try:
        procs.wait_healthy([proc], timeout=240)
        yield proc.url
    finally:
        procs.stop_all([proc])


def gen(url: str, body: dict, timeout: float = 120) -> requests.Response:
    return requests.post(url + "/generate", json=body, timeout=timeout)


def greedy(n: int, **kw) -> dict:
    return {P.MAX_NEW_TOKENS: n, P.TEMPERATURE: 0, **kw}


def test_reply_fields_and_prefix_cache(url):
    r = gen(url, {P.TEXT: CHAT, P.SAMPLING_PARAMS: greedy(6, ignore_eos=True)})
    assert r.status_code == 200, r.text
    out = r.json()
    meta = out[P.META_INFO]
    assert len(out[P.OUTPUT_IDS]) == 6 and isinstance(out[P.TEXT], str) and out[P.TEXT]
    assert meta[P.FINISH_REASON] == {"type": P.FINISH_LENGTH, "length": 6}
    assert meta[P.PROMPT_TOKENS] > 10 and meta[P.COMPLETION_TOKENS] == 6
    assert isinstance(meta[P.META_ID], str) and meta[P.E2E_LATENCY] > 0
    again = gen(url, {P.TEXT: CHAT, P.SAMPLING_PARAMS: greedy(6, ignore_eos=True)}).json()
    assert again[P.OUTPUT_IDS] == out[P.OUTPUT_IDS]
    # SGLang always computes the last prompt token
    assert again[P.META_INFO][P.CACHED_TOKENS] == meta[P.PROMPT_TOKENS] - 1


def test_input_ids_rid_and_logprobs(url):
    body = {
        P.INPUT_IDS: [1, 2, 3, 4, 5],
        P.RID: "conformance-rid",
        P.SAMPLING_PARAMS: greedy(3, ignore_eos=True),
        P.RETURN_LOGPROB: True,
        P.TOP_LOGPROBS_NUM: 2,
    }
    out = gen(url, body).json()
    meta = out[P.META_INFO]
    assert meta[P.PROMPT_TOKENS] == 5 and meta[P.META_ID] == "conformance-rid"
    lps, tops = meta[P.OUTPUT_TOKEN_LOGPROBS], meta[P.OUTPUT_TOP_LOGPROBS]
    assert [x[1] for x in lps] == out[P.OUTPUT_IDS] and all(x[0] <= 0 for x in lps)
    for (lp, tok, _), top in zip(lps, tops):
        assert len(top) == 2 and top[0][1] == tok and abs(top[0][0] - lp) < 1e-4


def test_stream_as_the_router_reads_it(url):
    body = {P.TEXT: CHAT, P.SAMPLING_PARAMS: greedy(5, ignore_eos=True), P.STREAM: True}
    with requests.post(url + "/generate", json=body, stream=True, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["Content-Type"].startswith(P.SSE_CONTENT_TYPE)
        lines = [ln for ln in r.iter_lines(decode_unicode=True) if ln]
    assert lines[-1] == P.SSE_DATA_PREFIX + P.SSE_DONE
    chunks = [P.parse_sse_line(ln) for ln in lines[:-1]]
    ids: list[int] = []
    for c in chunks:  # incremental or cumulative ids: the router takes the new ones
        ids += new_ids(c[P.OUTPUT_IDS], c[P.META_INFO], len(ids))
    last = chunks[-1][P.META_INFO]
    assert last[P.FINISH_REASON] == {"type": P.FINISH_LENGTH, "length": 5}
    assert last[P.COMPLETION_TOKENS] == 5
    full = gen(url, {P.TEXT: CHAT, P.SAMPLING_PARAMS: greedy(5, ignore_eos=True)}).json()
    assert ids == full[P.OUTPUT_IDS] and chunks[-1][P.TEXT] == full[P.TEXT]


def test_stop_token_and_eos(url):
    base = gen(url, {P.TEXT: CHAT, P.SAMPLING_PARAMS: greedy(8, ignore_eos=True)}).json()
    tok = base[P.OUTPUT_IDS][3]
    r = gen(url, {P.TEXT: CHAT, P.SAMPLING_PARAMS: greedy(8, stop_token_ids=[tok])}).json()
    assert r[P.OUTPUT_IDS] == base[P.OUTPUT_IDS][: base[P.OUTPUT_IDS].index(tok) + 1]
    assert r[P.META_INFO][P.FINISH_REASON] == {"type": P.FINISH_STOP, "matched": tok}
    short = "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n"
    natural = gen(url, {P.TEXT: short, P.SAMPLING_PARAMS: greedy(24)}).json()
    assert natural[P.META_INFO][P.FINISH_REASON] == {"type": P.FINISH_STOP, "matched": 2}


def test_abort_a_running_request(url):
    assert requests.post(url + "/abort_request", json={P.RID: "never-was"}).status_code == 200
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(
            gen,
            url,
            {P.TEXT: CHAT, P.RID: "to-abort", P.SAMPLING_PARAMS: greedy(400, ignore_eos=True)},
        )
        time.sleep(1.5)
        assert requests.post(url + "/abort_request", json={P.RID: "to-abort"}).status_code == 200
        r = fut.result()
    reason = r.json()[P.META_INFO][P.FINISH_REASON]
    assert reason["type"] == P.FINISH_ABORT, r.text
    assert len(r.json()[P.OUTPUT_IDS]) < 400


def test_flush_cache(url):
    gen(url, {P.TEXT: CHAT, P.SAMPLING_PARAMS: greedy(1)})
    assert requests.post(url + "/flush_cache", timeout=30).status_code == 200
    out = gen(url, {P.TEXT: CHAT, P.SAMPLING_PARAMS: greedy(1)}).json()
    assert out[P.META_INFO][P.CACHED_TOKENS] == 0


@pytest.mark.parametrize(
    "body, needle",
    [
        ({P.TEXT: "hi", P.SAMPLING_PARAMS: {"temprature": 0}}, "temprature"),
        ({P.TEXT: "hi", P.SAMPLING_PARAMS: {P.MAX_NEW_TOKENS: -1}}, "max_new_tokens"),
        ({P.TEXT: "hi", P.SAMPLING_PARAMS: {P.TOP_P: 0}}, "top_p"),
    ],
)
def test_bad_input_is_a_4xx_json_error_and_the_worker_keeps_serving(url, body, needle):
    """The error body's shape differs (SGLang: {"error": "<text>"} for sampling params, the
    reference: OpenAI style); the router shows either's text (router/sglang_client.py)."""
    r = gen(url, body)
    assert 400 <= r.status_code < 500, r.text
    assert isinstance(r.json(), dict) and needle in r.text
    assert gen(url, {P.INPUT_IDS: [1, 2], P.SAMPLING_PARAMS: greedy(1)}).ok
