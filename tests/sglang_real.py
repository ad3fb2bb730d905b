"""Shared pieces of the tests on real SGLang's CPU path (marker `sglang_cpu`, `make test-sglang`):
prompts, the plain servers every module shares (`sglang_nulls`), greedy reference outputs from the
reference engine, a warm-up formed by the router's own code, and one-model cluster specs.

An SGLang server costs ≈20-30 s of two cores to start (three processes that each import SGLang)
and ≈3.7 GB, so each is started once per session: the patched server, SGLang's own (the negative
control) and the reference engine start together; the PD tests (sorted last by conftest.py)
stop them before their own pair starts, so at most two SGLang servers run at once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import procs
import pytest
import requests

from router.cluster import ClusterSpec, Timeouts
from router.context import RouterContext
from router.orchestrator import Session
from sglang_ext import protocol as P

# SmolLM2 chat prompts; the second is long enough that a warm-up of its system turn matters.
CHAT = (
    "<|im_start|>user\nWrite one short sentence about the sea.<|im_end|>\n<|im_start|>assistant\n"
)
SYSTEM = (
    "<|im_start|>system\nYou are a careful problem solver. Work through the problem step by step, "
    "check each step, and finish with the final answer stated plainly. Keep the answer short and "
    "name the unit of every number you give.<|im_end|>\n"
)
QUESTION = "<|im_start|>user\nWhat is 7 times 8?<|im_end|>\n<|im_start|>assistant\n"
N_TOKENS = 8


def needs_sglang() -> None:
    """Skip, with the fix, where real SGLang is not installed (the project's own .venv)."""
    pytest.importorskip(
        "sglang", reason="real SGLang is not installed here: run `make test-sglang`"
    )


def tokenize(model_dir: str, text: str) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir).encode(text, add_special_tokens=False)


def greedy(url: str, input_ids: list[int], n: int = N_TOKENS, **body) -> dict:
    r = requests.post(
        url + "/generate",
        json={
            P.INPUT_IDS: input_ids,
            P.SAMPLING_PARAMS: {P.MAX_NEW_TOKENS: n, P.TEMPERATURE: 0, P.IGNORE_EOS: True},
            **body,
        },
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()


def reference_prompts(model_dir: str) -> list[list[int]]:
    """The prompts whose greedy ids every engine must agree on."""
    return [tokenize(model_dir, CHAT), tokenize(model_dir, SYSTEM + QUESTION)]


class NullServers:
    """The plain (`--disaggregation-mode null`) servers of the session, started together on first
    use: real SGLang through our patched launcher ("patched"), through SGLang's own launcher
    ("unpatched"), and, only while the first two start, the reference engine, whose greedy ids
    for reference_prompts() are kept. release() stops them; the next get() starts them again."""

    def __init__(self, model_dir: str, log_dir: Path):
        self.model_dir, self.log_dir = model_dir, log_dir
        self.procs: dict[str, procs.Proc] = {}
        self._reference: list[list[int]] | None = None

    def get(self, name: str) -> procs.Proc:
        if not self.procs:
            self._start()
        return self.procs[name]

    def reference_ids(self) -> list[list[int]]:
        if self._reference is None:
            ref = procs.start_worker("reference", self.model_dir, self.log_dir, "null")
            try:
                procs.wait_healthy([ref])
                self._reference = [
                    greedy(ref.url, ids)[P.OUTPUT_IDS] for ids in reference_prompts(self.model_dir)
                ]
            finally:
                procs.stop_all([ref])
        return self._reference

    def _start(self) -> None:
        started = []
        try:
            for name, patched in (("patched", True), ("unpatched", False)):
                started.append(
                    procs.start_worker(
                        f"sglang-{name}",
                        self.model_dir,
                        self.log_dir,
                        "null",
                        backend="sglang",
                        patched=patched,
                    )
                )
            self.reference_ids()  # the reference engine serves while SGLang is still importing
            procs.wait_healthy(started, timeout=300)
        except BaseException:
            procs.stop_all(started)
            raise
        self.procs = dict(zip(("patched", "unpatched"), started))

    def release(self) -> None:
        procs.stop_all(list(self.procs.values()))
        self.procs = {}


@pytest.fixture(scope="session")
def sglang_nulls(smollm2_dir, tmp_path_factory):
    needs_sglang()
    servers = NullServers(smollm2_dir, tmp_path_factory.mktemp("sglang-null"))
    try:
        yield servers
    finally:
        servers.release()


def cluster(
    router_url: str, prefill: procs.Proc, decode_url: str, model_dir: str, **kw
) -> ClusterSpec:
    return ClusterSpec.model_validate(
        {
            "models": {
                "smollm2": {
                    "router_url": router_url,
                    "prefill_urls": [prefill.url],
                    "decode_urls": [decode_url],
                    "bootstrap_ports": [prefill.bootstrap_port or procs.free_port()],
                    "model_path": model_dir,
                    "tokenizer_path": model_dir,
                }
            },
            "timeouts": Timeouts(read_s=120, warmup_s=120, precursor_wait_s=180).model_dump(),
            **kw,
        }
    )


def deployment_cluster(cluster: dict, **kw) -> ClusterSpec:
    """The ClusterSpec of a `moa-pd up` deployment (its cluster.json), with test timeouts."""
    timeouts = Timeouts(read_s=120, warmup_s=120, precursor_wait_s=180).model_dump()
    return ClusterSpec.model_validate({**cluster, "timeouts": timeouts, **kw})


def router_warmup(
    spec: ClusterSpec, input_ids: list[int], rid: str, model: str | None = None
) -> dict:
    """A warm-up sent by the router's own code (router/pd.py::Deployment.warmup) to `model`'s
    deployment (default: the spec's only model); its meta_info."""
    if model is None:
        if len(spec.models) != 1:
            raise ValueError(f"name the model to warm up: the spec serves {sorted(spec.models)}")
        model = next(iter(spec.models))

    async def send() -> dict:
        async with RouterContext.open(spec) as ctx:
            dep = ctx.deployments[model]
            target = dep.pick_prefill()
            try:
                return await dep.warmup(target, input_ids, P.WARMUP_RID_PREFIX + rid)
            finally:
                dep.unpin(target)

    return asyncio.run(send())


def pool_tokens(url: str) -> int:
    """The KV pool a worker sized at start (SGLang's /get_server_info `max_total_num_tokens`)."""
    r = requests.get(url + "/get_server_info", timeout=30)
    assert r.status_code == 200, f"{url}/get_server_info: {r.status_code} {r.text[:200]}"
    return int(r.json()["max_total_num_tokens"])


def flush(*urls: str, timeout_s: float = 60) -> None:
    """Flush each worker's radix cache. SGLang refuses (400) while a request is still live -- a
    PD worker holds one until its KV transfer is acknowledged -- so retry until it agrees."""
    for url in urls:
        deadline = time.monotonic() + timeout_s
        while (r := requests.post(url + "/flush_cache", timeout=30)).status_code != 200:
            assert time.monotonic() < deadline, f"{url}/flush_cache: {r.status_code} {r.text}"
            time.sleep(0.2)


async def pipelined_and_blocked(ctx, cfg, question: str, workers: list[str]) -> tuple:
    """(pipelined, blocking) results of one question, each on cold caches (`workers` flushed),
    blocking given the slot orders pipelining chose: under greedy decoding the two must give
    the same tokens."""
    flush(*workers)
    piped = await Session(ctx, cfg, question, "pipelined").run_all()
    orders = {a: t["slot_order"] for a, t in piped.trace.items() if t["slot_order"]}
    flush(*workers)
    blocked = await Session(ctx, cfg, question, "blocking", slot_orders=orders).run_all()
    return piped, blocked
