"""The patch plan: which behaviour changes a given SGLang version needs, and in which process.

Pure data, no SGLang import, so CPU tests check it; `sglang_ext.patch.apply` executes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_ext import protocol as P
from sglang_ext.patch.version import check_version

PREFILL_ONLY_ROUTE = "prefill_only_route"
WARMUP_RADIX_INSERT = "warmup_radix_insert"

# The first release where Req.__init__ (srt/managers/schedule_batch.py) sets
# `skip_radix_cache_insert = bootstrap_host == FAKE_BOOTSTRAP_HOST`; it is also the first release
# with SGLang's plugin loader (srt/plugins/__init__.py::load_plugins, called at the top of
# srt/managers/scheduler.py::run_scheduler_process), which is how the fix reaches the schedulers.
FAKE_HOST_SKIPS_INSERT_SINCE = (0, 5, 11)
# 0.5.11 renamed GenerateReqInput.data_parallel_rank to routed_dp_rank (the old name stays as a
# deprecated alias through 0.5.23); 0.5.3 and 0.5.8 only know data_parallel_rank.
ROUTED_DP_RANK_SINCE = (0, 5, 11)
LEGACY_DP_RANK_FIELD = "data_parallel_rank"


@dataclass(frozen=True, slots=True)
class Patch:
    """One behaviour change: its name, the process that applies it, and why it is needed."""

    name: str
    process: str  # "main" (the HTTP server's process) or "scheduler" (via SGLang's plugin loader)
    reason: str


def dp_rank_field(version: str) -> str:
    """The /generate key that pins a DP rank on this SGLang version."""
    if check_version(version) >= ROUTED_DP_RANK_SINCE:
        return P.ROUTED_DP_RANK
    return LEGACY_DP_RANK_FIELD


def patch_plan(version: str) -> list[Patch]:
    """The patches `version` needs, in the order they are applied; refuses unsupported versions."""
    rel = check_version(version)
    plan = [
        Patch(
            PREFILL_ONLY_ROUTE,
            "main",
            f"mount {P.PREFILL_ONLY_PATH} on srt/entrypoints/http_server.py::app: a fake-host "
            "generate with a {rid, prompt_tokens, cached_tokens} reply, as the torch backend has",
        )
    ]
    if rel >= FAKE_HOST_SKIPS_INSERT_SINCE:
        plan.append(
            Patch(
                WARMUP_RADIX_INSERT,
                "scheduler",
                "Req.__init__ marks fake-host prefills skip_radix_cache_insert, which throws our "
                f"warm-ups away; re-enable insertion for rids starting {P.WARMUP_RID_PREFIX!r}",
            )
        )
    return plan
