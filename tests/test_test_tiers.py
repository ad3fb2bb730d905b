"""The test tiers (Makefile, README "Tests"): `make test` deselects the tests marked `deployment`,
which `make test-deployment` runs. The core invariants must stay in `make test`: no file that
checks pipelined == blocking or the engine's logits against transformers may carry the marker,
and the marker must still select something (a renamed marker would empty the second tier)."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).parent
MARKER = re.compile(r"pytest\.mark\.deployment\b")
# What the first tier exists to check, as the tests that check it spell it.
CORE = re.compile(r"pipelined_equals_blocking|assert_logits_close|logits_match_transformers")


def test_core_invariants_stay_in_make_test():
    sources = {
        p.name: p.read_text() for p in TESTS.glob("test_*.py") if p.name != Path(__file__).name
    }
    core = {name for name, text in sources.items() if CORE.search(text)}
    assert {"test_router_engine.py", "test_model_forward.py"} <= core, sorted(core)
    marked = {name for name, text in sources.items() if MARKER.search(text)}
    assert marked, "no test is marked deployment: `make test-deployment` would run nothing"
    assert not core & marked, f"core invariants moved out of `make test`: {sorted(core & marked)}"
