"""Real SGLang 0.5.23 on its CPU path, one plain (`--disaggregation-mode null`) server at a time:
our patched launcher applies the patch (its log line, `/prefill_only`), a warm-up formed by the
router leaves its prefix cached with the patch and not without it (the negative control: SGLang's
own launcher), and greedy ids equal the reference engine's. Run by `make test-sglang`."""

from __future__ import annotations

import os
import sysconfig
import uuid

import procs
import pytest
import requests
from sglang_real import (
    CHAT,
    QUESTION,
    SYSTEM,
    cluster,
    greedy,
    needs_sglang,
    reference_outputs,
    router_warmup,
    tokenize,
)

from sglang_ext import protocol as P

pytestmark = pytest.mark.sglang_cpu
needs_sglang()

PATCHED, UNPATCHED = "sglang", "sglang-unpatched"


@pytest.fixture(scope="module")
def server(request, smollm2_dir, tmp_path_factory):
    """One SGLang server per parameter; pytest finishes one before it starts the next."""
    log_dir = tmp_path_factory.mktemp(request.param)
    proc = procs.start_worker(request.param, smollm2_dir, log_dir, "null", backend="sglang",
                              patched=request.param == PATCHED)
    try:
        procs.wait_healthy([proc], timeout=240)
        yield proc
    finally:
        procs.stop_all([proc])


def fresh_system() -> str:
    # A nonce keeps earlier requests from sharing more than the chat template with this one.
    return SYSTEM.replace("careful", f"careful ({uuid.uuid4().hex[:8]})")


@pytest.mark.parametrize("server", [PATCHED], indirect=True)
def test_patched_launcher_says_so_in_the_log_and_serves_prefill_only(server, smollm2_dir):
    log = server.log.read_text(errors="replace")
    # The main process applies the route, every SGLang process loads the scheduler hook.
    assert "moa-pd patch prefill_only_route applied for SGLang 0.5.23 (main)" in log
    assert "moa-pd patch warmup_radix_insert applied for SGLang 0.5.23 (scheduler)" in log
    assert "moa-pd: fake-host requests with rid prefix 'moa-warm-' are inserted" in log
    prefix = tokenize(smollm2_dir, fresh_system())
    r = requests.post(server.url + P.PREFILL_ONLY_PATH, json={P.INPUT_IDS: prefix}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body[P.RID].startswith(P.WARMUP_RID_PREFIX)
    assert body[P.PROMPT_TOKENS] == len(prefix) and body[P.CACHED_TOKENS] == 0
    again = requests.post(server.url + P.PREFILL_ONLY_PATH, json={P.INPUT_IDS: prefix},
                          timeout=60).json()
    assert again[P.CACHED_TOKENS] == len(prefix) - 1  # SGLang always computes the last token
    bad = requests.post(server.url + P.PREFILL_ONLY_PATH,
                        json={P.INPUT_IDS: prefix, P.TEMPERATURE: 0}, timeout=60)
    assert bad.status_code == 400 and "temperature" in bad.text


@pytest.mark.parametrize("server", [PATCHED, UNPATCHED], indirect=True)
def test_router_warmup_is_cached_only_with_the_patch(server, smollm2_dir):
    """The router's own warm-up (fake bootstrap host, rid moa-warm-...), then a longer prompt that
    extends it: cached_tokens is the warmed length with the patch, 0 on plain SGLang 0.5.23."""
    patched = server.name == PATCHED
    prefix = tokenize(smollm2_dir, fresh_system())
    full = prefix + tokenize(smollm2_dir, QUESTION)
    spec = cluster(server.url, server, server.url, smollm2_dir)
    meta = router_warmup(spec, prefix, uuid.uuid4().hex)
    assert meta[P.PROMPT_TOKENS] == len(prefix)
    out = greedy(server.url, full)
    assert out[P.META_INFO][P.PROMPT_TOKENS] == len(full)
    assert out[P.META_INFO][P.CACHED_TOKENS] == (len(prefix) if patched else 0)
    if not patched:  # the route exists only with the patch
        r = requests.post(server.url + P.PREFILL_ONLY_PATH, json={P.INPUT_IDS: prefix}, timeout=30)
        assert r.status_code == 404


@pytest.mark.parametrize("server", [PATCHED], indirect=True)
def test_prefill_only_warmup_is_cached(server, smollm2_dir):
    prefix = tokenize(smollm2_dir, fresh_system())
    spec = cluster(server.url, server, server.url, smollm2_dir, warmup_verb="prefill_only")
    meta = router_warmup(spec, prefix, uuid.uuid4().hex)
    assert meta[P.PROMPT_TOKENS] == len(prefix)
    out = greedy(server.url, prefix + tokenize(smollm2_dir, QUESTION))
    assert out[P.META_INFO][P.CACHED_TOKENS] == len(prefix)


@pytest.mark.parametrize("server", [PATCHED], indirect=True)
def test_greedy_ids_equal_the_reference_engine(server, smollm2_dir, tmp_path):
    prompts = [tokenize(smollm2_dir, CHAT), tokenize(smollm2_dir, SYSTEM + QUESTION)]
    got = [greedy(server.url, ids)[P.OUTPUT_IDS] for ids in prompts]
    assert got == reference_outputs(smollm2_dir, prompts, tmp_path)


def test_stand_in_kernels_are_what_sglang_imports():
    """The stand-in package is the one SGLang imports here, and it refuses every call."""
    import sgl_kernel

    assert sgl_kernel.__version__.endswith("moa-pd-cpu-standin")
    assert os.path.dirname(sgl_kernel.__file__).startswith(sysconfig.get_paths()["purelib"])
    with pytest.raises(NotImplementedError, match="stand-in"):
        sgl_kernel.copy_all_layer_kv_cache_cpu()
