"""Shared fixtures: model directories, and one real stack of worker processes per test session
(a null worker, a PD prefill + decode pair over NIXL, and the real sglang-router in front of the
pair), all serving SmolLM2-135M on loopback. Process helpers live in tests/procs.py.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import procs
from sglang_real import sglang_nulls  # noqa: F401 - a session fixture must live in conftest

# Short PD bootstrap timeouts so the "peer unreachable" cases fail in seconds, not SGLang's 300 s.
PD_TIMEOUT_S = 6
# A decode worker waits this long for KV from a prefill worker that accepted the request: longer,
# because on a loaded 2-core machine a 9-3-1 question's prefills can queue for more than 6 s.
PD_WAITING_TIMEOUT_S = 60
PD_PAGE_SIZE = 4
WORKER_ARGS = [
    "--max-total-tokens",
    "8192",
    "--max-running-requests",
    "16",
    "--chunked-prefill-size",
    "512",
    "--log-level",
    "info",
]


@dataclass
class Stack:
    null: procs.Proc
    prefill: procs.Proc
    decode: procs.Proc
    router: procs.Proc
    model_dir: str


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    from sglang_ext.engine.model_store import resolve_model_path

    return resolve_model_path("smollm2-135m")


@pytest.fixture(scope="session")
def stack(smollm2_dir, tmp_path_factory) -> Stack:
    """Start all four processes once; the logs stay under pytest's tmp dir for post-mortems."""
    log_dir = Path(os.environ.get("MOA_PD_TEST_LOGS") or tmp_path_factory.mktemp("stack-logs"))
    env = {
        "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": str(PD_TIMEOUT_S),
        "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": str(PD_WAITING_TIMEOUT_S),
    }
    started: list[procs.Proc] = []
    try:
        null = procs.start_worker(
            "null", smollm2_dir, log_dir, "null", WORKER_ARGS + ["--page-size", "1"], env
        )
        started.append(null)
        pd_args = WORKER_ARGS + ["--page-size", str(PD_PAGE_SIZE)]
        prefill = procs.start_worker("prefill", smollm2_dir, log_dir, "prefill", pd_args, env)
        started.append(prefill)
        decode = procs.start_worker("decode", smollm2_dir, log_dir, "decode", pd_args, env)
        started.append(decode)
        procs.wait_healthy([null, prefill, decode])
        router = procs.start_router(prefill, decode, log_dir)
        started.append(router)
        procs.wait_healthy([router], timeout=60)
        procs.wait_router_ready(router)
        yield Stack(null, prefill, decode, router, smollm2_dir)
    finally:
        procs.stop_all(started)


# pytest-timeout's 300 s (pyproject.toml) is the backstop for a hung test. A test on real SGLang
# may also pay for its fixture starting servers, which have their own deadlines that fail with the
# servers' log tails (300 s for the plain pair in sglang_real, 600 s for a PD stack in
# launch.stack); CI machines have run `make test-sglang` twice as slowly as this one (10:30 against
# 4:54): there the 300 s backstop fired in the first test on the PD stack (whose fixture starts it)
# while pytest was writing a report, and the session ended in an INTERNALERROR that said nothing
# else. So for these tests the backstop sits above those deadlines.
SGLANG_TEST_TIMEOUT_S = 1200


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture scope
def pytest_collection_modifyitems(items) -> None:
    """Tests on a real SGLang PD deployment run after the others on real SGLang: their fixture
    first stops the shared plain servers (sglang_real.NullServers), so that at most two SGLang
    servers (≈3.7 GB each) run at once and each starts once per session."""
    items.sort(key=lambda item: "sglang_pd" in getattr(item, "fixturenames", ()))
    for item in items:
        if item.get_closest_marker("sglang_cpu") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SGLANG_TEST_TIMEOUT_S))
