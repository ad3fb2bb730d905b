"""The null-mode worker over HTTP (SmolLM2-135M, a real process): endpoints, SGLang reply and
stream shapes, sampling controls, logprobs, bad input, client disconnects; plus the CLI's flag
checks."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
import time

import pytest
import requests
from procs import REPO

from sglang_ext import protocol as P
from sglang_ext.server_args import UnsupportedFlagError, parse_args

pytestmark = pytest.mark.slow

CHAT = (
    "<|im_start|>user\nWrite one short sentence about the sea.<|im_end|>\n<|im_start|>assistant\n"
)


def gen(url: str, body: dict, timeout: float = 60) -> requests.Response:
    return requests.post(url + "/generate", json=body, timeout=timeout)


def greedy(n: int, **kw) -> dict:
    return {"max_new_tokens": n, "temperature": 0, **kw}


def stats(url: str) -> dict:
    return requests.get(url + "/get_server_info", timeout=10).json()["kv_pool"]


def test_plain_routes(stack):
    url = stack.null.url
    assert requests.get(url + "/health").status_code == 200
    assert requests.get(url + "/health_generate", timeout=30).status_code == 200
    for path in ("/get_model_info", "/model_info"):
        assert requests.get(url + path).json()["model_path"] == stack.model_dir
    for path in ("/get_server_info", "/server_info"):
        info = requests.get(url + path).json()
        assert info["disaggregation_mode"] == "null"
        assert {
            "total_pages",
            "free_pages",
            "cached_pages",
            "in_use_pages",
            "num_running_reqs",
            "num_waiting_reqs",
        } <= set(info["kv_pool"])
    assert requests.get(url + "/v1/models").json()["data"][0]["id"]
    metrics = requests.get(url + "/metrics").text
    assert "sglang:generated_tokens_total" in metrics and "sglang:free_pages" in metrics


def test_generate_shape_and_prefix_cache(stack):
    url = stack.null.url
    r = gen(url, {"text": CHAT, "sampling_params": greedy(6, ignore_eos=True)})
    assert r.status_code == 200, r.text
    out = r.json()
    meta = out[P.META_INFO]
    assert len(out[P.OUTPUT_IDS]) == 6 and isinstance(out[P.TEXT], str) and out[P.TEXT]
    assert meta[P.FINISH_REASON] == {"type": "length", "length": 6}
    assert meta[P.PROMPT_TOKENS] > 10 and meta[P.COMPLETION_TOKENS] == 6
    assert {P.META_ID, P.CACHED_TOKENS, P.E2E_LATENCY} <= set(meta)
    again = gen(url, {"text": CHAT, "sampling_params": greedy(6, ignore_eos=True)}).json()
    assert again[P.OUTPUT_IDS] == out[P.OUTPUT_IDS]
    assert again[P.META_INFO][P.CACHED_TOKENS] == meta[P.PROMPT_TOKENS] - 1


def test_stream_shape(stack):
    body = {
        "text": CHAT,
        "sampling_params": greedy(5, ignore_eos=True),
        "stream": True,
        "return_logprob": True,
    }
    with requests.post(stack.null.url + "/generate", json=body, stream=True, timeout=60) as r:
        assert r.headers["Content-Type"].startswith(P.SSE_CONTENT_TYPE)
        lines = [ln for ln in r.iter_lines(decode_unicode=True) if ln]
    assert lines[-1] == "data: [DONE]"
    chunks = [P.parse_sse_line(ln) for ln in lines[:-1]]
    ids = [t for c in chunks for t in c[P.OUTPUT_IDS]]
    lps = [x for c in chunks for x in c[P.META_INFO][P.OUTPUT_TOKEN_LOGPROBS]]
    assert len(ids) == 5 and [x[1] for x in lps] == ids  # incremental ids and logprobs
    assert all(P.META_INFO in c for c in chunks)
    assert P.E2E_LATENCY in chunks[-1][P.META_INFO]
    assert all(P.E2E_LATENCY not in c[P.META_INFO] for c in chunks[:-1])
    texts = [c[P.TEXT] for c in chunks]
    assert all(texts[i + 1].startswith(texts[i]) for i in range(len(texts) - 1))  # cumulative
    full = gen(stack.null.url, {"text": CHAT, "sampling_params": greedy(5, ignore_eos=True)})
    assert full.json()[P.OUTPUT_IDS] == ids and full.json()[P.TEXT] == texts[-1]


def test_logprobs_and_top_logprobs(stack):
    r = gen(
        stack.null.url,
        {
            "text": CHAT,
            "sampling_params": greedy(4, ignore_eos=True),
            "return_logprob": True,
            "top_logprobs_num": 3,
        },
    ).json()
    lps, tops = r[P.META_INFO][P.OUTPUT_TOKEN_LOGPROBS], r[P.META_INFO][P.OUTPUT_TOP_LOGPROBS]
    assert [x[1] for x in lps] == r[P.OUTPUT_IDS]
    for (lp, tok, _), top in zip(lps, tops):
        assert lp <= 0 and len(top) == 3
        assert top[0][1] == tok and abs(top[0][0] - lp) < 1e-5  # greedy picks the top token
        assert top[0][0] >= top[1][0] >= top[2][0]


def test_stop_string_stop_token_and_eos(stack):
    url = stack.null.url
    base = gen(url, {"text": CHAT, "sampling_params": greedy(12, ignore_eos=True)}).json()
    words = base[P.TEXT].split()
    stop = words[2]
    r = gen(url, {"text": CHAT, "sampling_params": greedy(12, stop=stop)}).json()
    assert r[P.META_INFO][P.FINISH_REASON] == {"type": "stop", "matched": stop}
    assert r[P.TEXT] == base[P.TEXT][: base[P.TEXT].find(stop)]
    tok = base[P.OUTPUT_IDS][3]
    r = gen(url, {"text": CHAT, "sampling_params": greedy(12, stop_token_ids=[tok])}).json()
    assert r[P.OUTPUT_IDS] == base[P.OUTPUT_IDS][: base[P.OUTPUT_IDS].index(tok) + 1]
    assert r[P.META_INFO][P.FINISH_REASON] == {"type": "stop", "matched": tok}
    # the chat answer ends with <|im_end|> (EOS); ignore_eos runs on to max_new_tokens
    short = "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n"
    natural = gen(url, {"text": short, "sampling_params": greedy(24)}).json()
    assert natural[P.META_INFO][P.FINISH_REASON] == {"type": "stop", "matched": 2}  # <|im_end|>
    n = len(natural[P.OUTPUT_IDS])
    forced = gen(url, {"text": short, "sampling_params": greedy(n + 1, ignore_eos=True)}).json()
    assert forced[P.META_INFO][P.FINISH_REASON] == {"type": "length", "length": n + 1}


def test_seeded_sampling_repeats_in_any_batch(stack):
    url = stack.null.url
    sp = {
        "max_new_tokens": 8,
        "temperature": 1.0,
        "top_p": 0.9,
        "top_k": 50,
        "sampling_seed": 1234,
        "ignore_eos": True,
    }
    alone = gen(url, {"text": CHAT, "sampling_params": sp}).json()[P.OUTPUT_IDS]
    with concurrent.futures.ThreadPoolExecutor(3) as ex:
        futs = [
            ex.submit(gen, url, {"text": CHAT, "sampling_params": sp}),
            ex.submit(gen, url, {"text": "Hello", "sampling_params": greedy(8)}),
            ex.submit(gen, url, {"text": CHAT, "sampling_params": sp | {"sampling_seed": 7}}),
        ]
        batched, _, other = (f.result().json()[P.OUTPUT_IDS] for f in futs)
    assert batched == alone
    assert other != alone


@pytest.mark.parametrize(
    "body, needle",
    [
        ("{not json", "malformed JSON"),
        ({"sampling_params": {}}, "no prompt"),
        ({"text": "hi", "input_ids": [1, 2]}, "not both"),
        ({"text": "hi", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        ({"text": "hi", "sampling_params": {"max_new_tokens": 10**9}}, "context length"),
        ({"input_ids": [5] * 9000}, "longer than the model's context length"),
        ({"input_ids": [1, 49152, 7]}, "out of vocabulary"),
        ({"text": "hi", "sampling_params": {"temprature": 0}}, "temprature"),
        ({"text": "hi", "sampling_params": {"top_p": 0}}, "top_p"),
        ({"text": "hi", "top_logprobs_num": 1000, "return_logprob": True}, "top_logprobs_num"),
    ],
)
def test_bad_input_is_400_and_worker_keeps_serving(stack, body, needle):
    url = stack.null.url + "/generate"
    r = (
        requests.post(url, data=body, timeout=30)
        if isinstance(body, str)
        else requests.post(url, json=body, timeout=30)
    )
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]
    assert gen(stack.null.url, {"input_ids": [1, 2], "sampling_params": greedy(1)}).ok


def test_abort_unknown_rid_and_abort_running(stack):
    url = stack.null.url
    r = requests.post(url + "/abort_request", json={"rid": "never-was"})
    assert r.status_code == 200 and r.json()["success"] is False
    assert requests.post(url + "/abort_request", json={}).status_code == 400
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(
            gen,
            url,
            {"text": CHAT, "rid": "to-abort", "sampling_params": greedy(400, ignore_eos=True)},
        )
        time.sleep(1.0)
        assert requests.post(url + "/abort_request", json={"rid": "to-abort"}).json()["success"]
        out = fut.result().json()
    assert out[P.META_INFO][P.FINISH_REASON]["type"] == "abort"
    assert stats(url)["in_use_pages"] == 0


def test_client_disconnect_mid_stream_frees_pages(stack):
    url = stack.null.url
    body = {"text": CHAT, "stream": True, "sampling_params": greedy(500, ignore_eos=True)}
    with requests.post(url + "/generate", json=body, stream=True, timeout=60) as r:
        next(r.iter_lines())
    deadline = time.monotonic() + 10
    while (s := stats(url))["num_live_reqs"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert s["num_live_reqs"] == 0 and s["in_use_pages"] == 0 and s["reserved_pages"] == 0
    assert s["free_pages"] + s["cached_pages"] == s["total_pages"]


def test_openai_routes(stack):
    url = stack.null.url
    r = requests.post(
        url + "/v1/chat/completions",
        timeout=60,
        json={
            "model": "x",
            "messages": [{"role": "user", "content": "Say hi."}],
            "max_tokens": 5,
            "temperature": 0,
        },
    ).json()
    assert r["object"] == "chat.completion" and r["choices"][0]["message"]["role"] == "assistant"
    assert r["usage"]["completion_tokens"] <= 5
    r = requests.post(
        url + "/v1/completions",
        json={"prompt": "The sea is", "max_tokens": 4, "temperature": 0},
        timeout=60,
    ).json()
    assert r["object"] == "text_completion" and r["choices"][0]["finish_reason"] == "length"
    body = {
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=60) as resp:
        events = [ln for ln in resp.iter_lines(decode_unicode=True) if ln]
    assert events[-1] == "data: [DONE]"
    parsed = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    assert parsed[0]["object"] == "chat.completion.chunk" and parsed[-1]["usage"]
    assert requests.post(url + "/v1/chat/completions", json={"messages": []}).status_code == 400


def test_flush_cache(stack):
    url = stack.null.url
    assert requests.post(url + "/flush_cache", timeout=10).status_code == 200
    assert stats(url)["cached_pages"] == 0


def test_cli_rejects_unsupported_flags():
    with pytest.raises(UnsupportedFlagError, match="--tp-size"):
        parse_args(["--model-path", "m", "--tp-size", "2"])
    args = parse_args(
        [
            "--model-path",
            "m",
            "--disaggregation-mode",
            "prefill",
            "--page-size",
            "4",
            "--enable-metrics",
        ]
    )
    assert args.page_size == 4 and args.disaggregation_mode == "prefill"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang_ext.launch_server",
            "--backend",
            "torch",
            "--model-path",
            "m",
            "--mem-fraction-static",
            "0.8",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "--mem-fraction-static" in proc.stderr and "torch backend" in proc.stderr


def test_openai_stream_never_sends_part_of_a_stop_string(stack):
    url = stack.null.url + "/v1/completions"
    body = {"prompt": "The sea is", "max_tokens": 16, "temperature": 0}
    base = requests.post(url, json=body, timeout=60).json()["choices"][0]["text"]
    words = base.split()
    stop = " " + " ".join(words[2:4])  # several tokens long
    assert stop in base
    with requests.post(
        url, json=body | {"stop": stop, "stream": True}, stream=True, timeout=60
    ) as r:
        events = [ln for ln in r.iter_lines(decode_unicode=True) if ln]
    assert events[-1] == "data: [DONE]"
    streamed = "".join(json.loads(e[len("data: ") :])["choices"][0]["text"] for e in events[:-1])
    assert streamed == base[: base.find(stop)]
