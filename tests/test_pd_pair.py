"""The PD pair behind the real sglang-router (SmolLM2-135M, NIXL over UCX on loopback): greedy
equality with the null worker and with transformers, warm-up reuse, aborts, concurrency, and the
PD-specific bad inputs."""

from __future__ import annotations

import concurrent.futures
import json
import random
import time

import pytest
import requests
from conftest import PD_PAGE_SIZE, PD_TIMEOUT_S
from procs import free_port

from sglang_ext import protocol as P

pytestmark = pytest.mark.slow


def ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 20000) for _ in range(n)]


def greedy(n: int) -> dict:
    return {"max_new_tokens": n, "temperature": 0}


def post(url: str, body: dict, timeout: float = 60) -> requests.Response:
    return requests.post(url + "/generate", json=body, timeout=timeout)


def pool(url: str) -> dict:
    return requests.get(url + "/get_server_info", timeout=10).json()["kv_pool"]


def wait_idle(url: str, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        s = pool(url)
        if (
            s["num_live_reqs"] == 0 and s["in_use_pages"] == 0 and s["reserved_pages"] == 0
        ) or time.monotonic() > deadline:
            return s
        time.sleep(0.2)


def room() -> int:
    return P.new_bootstrap_room()


def fragment_pools(stack) -> None:
    """Leave both workers' free page lists scattered: requests of different lengths run at once
    and finish at different times, so the next request gets non-adjacent pages on decode, in an
    order unrelated to prefill's (the transfer must map page i to page i, not by address)."""
    rng = random.Random(3)
    bodies = [
        {"input_ids": ids(rng, 9 + 7 * i), "sampling_params": greedy(2 + 5 * (i % 3))}
        for i in range(6)
    ]
    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        for r in ex.map(lambda b: post(stack.router.url, b), bodies):
            assert r.status_code == 200, r.text


def test_greedy_router_pd_equals_null_equals_transformers(stack):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    fragment_pools(stack)

    tok = AutoTokenizer.from_pretrained(stack.model_dir)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Name three colors."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    input_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    n = 16  # the model ends its answer (<|im_end|>) after 12 tokens: EOS handling is compared too
    body = {"input_ids": input_ids, "sampling_params": greedy(n)}
    via_router = post(stack.router.url, body)
    assert via_router.status_code == 200, via_router.text
    via_null = post(stack.null.url, body).json()
    model = AutoModelForCausalLM.from_pretrained(stack.model_dir, dtype="float32").eval()
    out = model.generate(
        torch.tensor([input_ids]),
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id,
    )
    hf = out[0, len(input_ids) :].tolist()
    assert via_router.json()["output_ids"] == via_null["output_ids"] == hf
    assert hf[-1] == tok.eos_token_id
    assert via_router.json()["meta_info"][P.FINISH_REASON] == {
        "type": "stop",
        "matched": tok.eos_token_id,
    }


def test_warmup_with_fake_host_then_full_request_hits_cache(stack):
    rng = random.Random(11)
    for warm_len in (40, 42):  # 42 is not page-aligned: only 40 tokens (10 pages of 4) are kept
        prefix = ids(rng, warm_len)
        warm = requests.post(
            stack.prefill.url + P.PREFILL_ONLY_PATH, json={"input_ids": prefix}, timeout=30
        )
        assert warm.status_code == 200, warm.text
        assert warm.json()[P.CACHED_TOKENS] == 0 and warm.json()[P.PROMPT_TOKENS] == warm_len
        full = prefix + ids(rng, 6)
        r = post(stack.router.url, {"input_ids": full, "sampling_params": greedy(3)})
        assert r.status_code == 200, r.text
        aligned = warm_len // PD_PAGE_SIZE * PD_PAGE_SIZE
        # decode's cached_tokens travelled from prefill in the transfer's aux data
        assert r.json()["meta_info"][P.CACHED_TOKENS] == aligned
    # a raw fake-host generate (as SGLang's own warm-ups) is cached the same way
    prefix = ids(rng, 24)
    raw = {
        "input_ids": prefix,
        "sampling_params": greedy(1),
        P.BOOTSTRAP_HOST: P.FAKE_BOOTSTRAP_HOST,
        P.BOOTSTRAP_ROOM: room(),
    }
    first = post(stack.prefill.url, raw).json()
    assert first["meta_info"][P.FINISH_REASON] == {"type": "length", "length": 1}
    again = post(stack.prefill.url, dict(raw, input_ids=prefix + [7, 7], bootstrap_room=room()))
    assert again.json()["meta_info"][P.CACHED_TOKENS] == 24


def test_fifty_aborted_requests_leave_the_pools_free(stack):
    rng = random.Random(5)

    def one(i: int) -> None:
        rid = f"abort-{i}-{rng.random()}"
        body = {
            "input_ids": ids(rng, 8 + i % 16),
            "sampling_params": greedy(48),
            "stream": True,
            "rid": rid,
        }
        if i % 2:  # half: the client walks away after the first chunk
            with requests.post(
                stack.router.url + "/generate", json=body, stream=True, timeout=60
            ) as r:
                next(r.iter_lines())
        else:  # half: /abort_request on both workers while it runs
            with requests.post(
                stack.router.url + "/generate", json=body, stream=True, timeout=60
            ) as r:
                for w in (stack.decode, stack.prefill):
                    requests.post(w.url + "/abort_request", json={"rid": rid}, timeout=10)
                for _ in r.iter_lines():
                    pass

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        list(ex.map(one, range(50)))
    for w in (stack.prefill, stack.decode):
        s = wait_idle(w.url)
        assert s["num_live_reqs"] == 0 and s["in_use_pages"] == 0 and s["reserved_pages"] == 0, s
        assert s["free_pages"] + s["cached_pages"] == s["total_pages"], s
    assert pool(stack.decode.url)["cached_pages"] == 0  # decode keeps no radix cache


def test_eight_concurrent_streams_are_correct(stack):
    rng = random.Random(8)
    prompts = [ids(rng, 10 + 3 * i) for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        expected = [
            r.json()
            for r in ex.map(
                lambda p: post(stack.null.url, {"input_ids": p, "sampling_params": greedy(8)}),
                prompts,
            )
        ]

    def stream(p: list[int]) -> tuple[list[int], str, dict]:
        body = {"input_ids": p, "sampling_params": greedy(8), "stream": True}
        out, text, meta = [], "", {}
        with requests.post(
            stack.router.url + "/generate", json=body, stream=True, timeout=120
        ) as r:
            assert r.status_code == 200, r.text
            for line in r.iter_lines(decode_unicode=True):
                chunk = P.parse_sse_line(line or "")
                if chunk:
                    out += chunk["output_ids"]  # new ids per chunk
                    text, meta = chunk["text"], chunk["meta_info"]  # text is cumulative
        return out, text, meta

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        got = list(ex.map(stream, prompts))
    for (out, text, meta), exp in zip(got, expected):
        assert out == exp["output_ids"]
        assert text == exp["text"]
        assert meta["completion_tokens"] == 8 and P.E2E_LATENCY in meta


def test_pd_request_without_room_is_400(stack):
    for w in (stack.prefill, stack.decode):
        r = post(w.url, {"input_ids": [5, 6, 7], "sampling_params": greedy(2)})
        assert r.status_code == 400 and "bootstrap room" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "fields, needle",
    [
        ({P.BOOTSTRAP_ROOM: "seven", P.BOOTSTRAP_HOST: "127.0.0.1"}, "bootstrap_room"),
        ({P.BOOTSTRAP_ROOM: -1, P.BOOTSTRAP_HOST: "127.0.0.1"}, "bootstrap_room"),
        (
            {P.BOOTSTRAP_ROOM: 1, P.BOOTSTRAP_HOST: "127.0.0.1", P.BOOTSTRAP_PORT: 70000},
            "bootstrap_port",
        ),
        ({P.BOOTSTRAP_ROOM: 1}, "bootstrap_host"),
    ],
)
def test_bad_bootstrap_fields_are_400(stack, fields, needle):
    for w in (stack.prefill, stack.decode):
        r = post(w.url, {"input_ids": [5, 6], "sampling_params": greedy(2)} | fields)
        assert r.status_code == 400 and needle in r.json()["error"]["message"]


def test_fake_host_on_decode_is_400(stack):
    r = post(
        stack.decode.url,
        {"input_ids": [5, 6], P.BOOTSTRAP_HOST: P.FAKE_BOOTSTRAP_HOST, P.BOOTSTRAP_ROOM: 3},
    )
    assert r.status_code == 400 and "prefill" in r.json()["error"]["message"]


def test_unreachable_peers_fail_with_a_reason_and_workers_keep_serving(stack):
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        # prefill with a real host but no decode ever connecting: times out, says why
        lonely = ex.submit(
            post,
            stack.prefill.url,
            {"input_ids": [5, 6, 7], P.BOOTSTRAP_HOST: "127.0.0.1", P.BOOTSTRAP_ROOM: room()},
        )
        # decode pointed at a prefill bootstrap port where nothing listens
        dead_port = free_port()
        orphan = ex.submit(
            post,
            stack.decode.url,
            {
                "input_ids": [5, 6, 7],
                P.BOOTSTRAP_HOST: "127.0.0.1",
                P.BOOTSTRAP_PORT: dead_port,
                P.BOOTSTRAP_ROOM: room(),
            },
        )
        r = orphan.result()
        assert r.status_code >= 500 and str(dead_port) in r.json()["error"]["message"], r.text
        t0 = time.monotonic()
        r = lonely.result()
        assert r.status_code >= 500, r.text
        assert "decode" in r.json()["error"]["message"].lower()
        assert time.monotonic() - t0 < PD_TIMEOUT_S + 10
    for w in (stack.prefill, stack.decode):
        assert wait_idle(w.url)["in_use_pages"] == 0
    r = post(stack.router.url, {"input_ids": [5, 6, 7], "sampling_params": greedy(2)})
    assert r.status_code == 200


def test_worker_info_routes(stack):
    for w in (stack.prefill, stack.decode):
        info = requests.get(w.url + "/get_server_info", timeout=10).json()
        assert info["disaggregation_mode"] in ("prefill", "decode")
        assert info["page_size"] == PD_PAGE_SIZE
        m = requests.get(w.url + "/get_model_info", timeout=10).json()
        assert m["model_path"] == stack.model_dir and m["is_generation"] is True
        assert requests.get(w.url + "/health_generate", timeout=30).status_code == 200
        assert json.loads(requests.get(w.url + "/get_load", timeout=10).text)[0]["dp_rank"] == 0
