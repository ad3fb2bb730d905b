"""Real SGLang 0.5.23 on its CPU path, plain (`--disaggregation-mode null`) servers shared by the session:
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
    QUESTION,
    SYSTEM,
    cluster,
    flush,
    greedy,
    needs_sglang,
    reference_prompts,
    router_warmup,
    tokenize,
)

from sglang_ext import protocol as P

pytestmark = pytest.mark.sglang_cpu
needs_sglang()

PATCHED, UNPATCHED = "patched", "unpatched"


@pytest.fixture
def server(sglang_nulls) -> procs.Proc:
    """Real SGLang through our launcher (shared by the session: sglang_real.NullServers)."""
    return sglang_nulls.get(PATCHED)


def fresh_system() -> str:
    # A nonce keeps earlier requests from sharing more than the chat template with this one.
    return SYSTEM.replace("careful", f"careful ({uuid.uuid4().hex[:8]})")


def test_patched_launcher_says_so_in_the_log_and_serves_prefill_only(server, smollm2_dir):
    log = server.log.read_text(errors="replace")
    # The main process applies the route, every SGLang process loads the scheduler hook.
    assert "moa-pd patch prefill_only_route applied for SGLang 0.5.23 (main)" in log
    assert "moa-pd patch warmup_radix_insert applied for SGLang 0.5.23 (scheduler)" in log
    assert "moa-pd: fake-host requests with rid prefix 'moa-warm-' are inserted" in log
    prefix = tokenize(smollm2_dir, fresh_system())
    flush(server.url)  # the server is shared: earlier tests cached the chat template's start
    r = requests.post(server.url + P.PREFILL_ONLY_PATH, json={P.INPUT_IDS: prefix}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body[P.RID].startswith(P.WARMUP_RID_PREFIX)
    assert body[P.PROMPT_TOKENS] == len(prefix) and body[P.CACHED_TOKENS] == 0
    again = requests.post(
        server.url + P.PREFILL_ONLY_PATH, json={P.INPUT_IDS: prefix}, timeout=60
    ).json()
    assert again[P.CACHED_TOKENS] == len(prefix) - 1  # SGLang always computes the last token
    bad = requests.post(
        server.url + P.PREFILL_ONLY_PATH, json={P.INPUT_IDS: prefix, P.TEMPERATURE: 0}, timeout=60
    )
    assert bad.status_code == 400 and "temperature" in bad.text


@pytest.mark.parametrize("launcher", [PATCHED, UNPATCHED])
def test_router_warmup_is_cached_only_with_the_patch(launcher, sglang_nulls, smollm2_dir):
    """The router's own warm-up (fake bootstrap host, rid moa-warm-...), then a longer prompt that
    extends it: cached_tokens is the warmed length with the patch, 0 on plain SGLang 0.5.23."""
    server, patched = sglang_nulls.get(launcher), launcher == PATCHED
    prefix = tokenize(smollm2_dir, fresh_system())
    full = prefix + tokenize(smollm2_dir, QUESTION)
    spec = cluster(server.url, server, server.url, smollm2_dir)
    meta = router_warmup(spec, prefix, uuid.uuid4().hex)
    assert meta[P.PROMPT_TOKENS] == len(prefix)
    out = greedy(server.url, full)
    assert out[P.META_INFO][P.PROMPT_TOKENS] == len(full)
    assert out[P.META_INFO][P.CACHED_TOKENS] == (len(prefix) if patched else 0)
    if not patched:  # the route and the log lines exist only with the patch
        assert "moa-pd patch" not in server.log.read_text(errors="replace")
        r = requests.post(server.url + P.PREFILL_ONLY_PATH, json={P.INPUT_IDS: prefix}, timeout=30)
        assert r.status_code == 404


def test_prefill_only_warmup_is_cached(server, smollm2_dir):
    prefix = tokenize(smollm2_dir, fresh_system())
    spec = cluster(server.url, server, server.url, smollm2_dir, warmup_verb="prefill_only")
    meta = router_warmup(spec, prefix, uuid.uuid4().hex)
    assert meta[P.PROMPT_TOKENS] == len(prefix)
    out = greedy(server.url, prefix + tokenize(smollm2_dir, QUESTION))
    assert out[P.META_INFO][P.CACHED_TOKENS] == len(prefix)


def test_greedy_ids_equal_the_reference_engine(server, sglang_nulls, smollm2_dir):
    got = [greedy(server.url, ids)[P.OUTPUT_IDS] for ids in reference_prompts(smollm2_dir)]
    assert got == sglang_nulls.reference_ids()


def test_stand_in_kernels_are_what_sglang_imports():
    """The stand-in package is the one SGLang imports here, and it refuses every call."""
    import sgl_kernel

    assert sgl_kernel.__version__.endswith("moa-pd-cpu-standin")
    assert os.path.dirname(sgl_kernel.__file__).startswith(sysconfig.get_paths()["purelib"])
    with pytest.raises(NotImplementedError, match="stand-in"):
        sgl_kernel.copy_all_layer_kv_cache_cpu()
