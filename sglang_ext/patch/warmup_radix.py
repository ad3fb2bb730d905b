"""Warm-up radix insertion for SGLang 0.5.11+: our fake-host warm-ups stay in the prefix cache.

SGLang's plugin loader calls `register_plugin` in every scheduler process (entry point group
`sglang.srt.plugins`); it hooks the one decision, `Req.skip_radix_cache_insert`, after `Req.__init__`.
"""

from __future__ import annotations

import logging
import os

from sglang_ext import protocol as P
from sglang_ext.patch import cpu_nixl

logger = logging.getLogger(__name__)

# Set by sglang_ext.patch.apply in the server's main process; SGLang's spawned children inherit
# it. Without it the plugin does nothing, so a plain `sglang serve` in the same environment keeps
# SGLang's own behaviour even though the entry point is installed.
ENABLE_ENV = "MOA_PD_SGLANG_PATCH"
ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT_NAME = "moa_pd_warmup_radix"
ENTRY_POINT_VALUE = "sglang_ext.patch.warmup_radix:register_plugin"
# 0.5.11 .. 0.5.23: srt/managers/schedule_batch.py::Req.__init__ sets
#   skip_radix_cache_insert = (bootstrap_host == FAKE_BOOTSTRAP_HOST [or positional_embed_overrides])
# and mem_cache/common.py (maybe_cache_unfinished_req, release_kv_cache in 0.5.11;
# checkpoint_kv_cache, release_kv_cache in 0.5.23) skip the tree insert when it is True.
HOOK_TARGET = "sglang.srt.managers.schedule_batch.Req.__init__"


def is_our_warmup(req: object) -> bool:
    """True for a fake-host request carrying our warm-up rid and nothing else that forbids caching.

    0.5.23 also sets the flag for positional embedding overrides (KV the token ids do not
    determine); those must stay out of the tree, so the hook only undoes the fake-host reason.
    """
    rid = getattr(req, "rid", None)
    return (
        isinstance(rid, str)
        and rid.startswith(P.WARMUP_RID_PREFIX)
        and getattr(req, "bootstrap_host", None) == P.FAKE_BOOTSTRAP_HOST
        and getattr(req, "positional_embed_overrides", None) is None
    )


def after_req_init(result: object, req: object, *args: object, **kwargs: object) -> None:
    """AFTER hook on Req.__init__ (SGLang calls it as hook(result, self, *args, **kwargs)).

    Later decisions that also set the flag (mamba state, failed external KV loads in 0.5.23)
    happen after __init__ and are left alone.
    """
    if is_our_warmup(req):
        req.skip_radix_cache_insert = False  # type: ignore[attr-defined]


def register_plugin() -> None:
    """SGLang plugin entry point: register the AFTER hook when moa-pd launched this server."""
    if os.environ.get(ENABLE_ENV) != "1":
        logger.debug(
            "moa-pd warm-up patch not enabled (%s unset); leaving SGLang as is", ENABLE_ENV
        )
        return
    # Imported here: this module must stay importable without SGLang (CPU tests, the plan).
    from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if FAKE_BOOTSTRAP_HOST != P.FAKE_BOOTSTRAP_HOST:
        raise RuntimeError(
            f"SGLang's FAKE_BOOTSTRAP_HOST is {FAKE_BOOTSTRAP_HOST!r} but sglang_ext.protocol says "
            f"{P.FAKE_BOOTSTRAP_HOST!r}; update protocol.py for this SGLang version"
        )
    HookRegistry.register(HOOK_TARGET, after_req_init, HookType.AFTER)
    # WARNING: SGLang loads plugins before it configures the scheduler's logging, so an INFO
    # line would be dropped and the log would not show that the patch is active.
    logger.warning(
        "moa-pd: fake-host requests with rid prefix %r are inserted into the radix cache (pid %d)",
        P.WARMUP_RID_PREFIX,
        os.getpid(),
    )
    if os.environ.get(cpu_nixl.CPU_ENGINE_ENV, "").lower() in ("1", "true"):
        cpu_nixl.register_kv_as_dram()
