"""`apply(version)`: run the patch plan in the SGLang server's main process, before it serves.

Called by `sglang_ext.sglang_backend.worker` (the `--backend sglang` entry) just before it hands
over to `sglang.launch_server`. Scheduler-side patches are only checked and enabled here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from importlib import metadata

from sglang_ext.patch import prefill_only_route, warmup_radix
from sglang_ext.patch.plan import (
    PREFILL_ONLY_ROUTE,
    WARMUP_RADIX_INSERT,
    Patch,
    dp_rank_field,
    patch_plan,
)
from sglang_ext.patch.version import installed_version

logger = logging.getLogger(__name__)


class PatchNotReachable(RuntimeError):
    """A patch cannot reach the process that needs it; the message says how to fix the install."""


def check_plugin_reachable(
    env: Mapping[str, str] | None = None,
    find_entry_points: Callable[[str], Iterable] | None = None,
) -> None:
    """Raise unless SGLang's plugin loader will find and run our scheduler hook.

    The scheduler processes are spawned fresh (multiprocessing "spawn"), so nothing patched in
    this process reaches them; SGLang's loader (srt/plugins/__init__.py::load_plugins) imports
    entry points of group `sglang.srt.plugins` there, filtered by the SGLANG_PLUGINS whitelist.
    """
    env = os.environ if env is None else env
    find = find_entry_points or (lambda group: metadata.entry_points(group=group))
    ours = [
        ep
        for ep in find(warmup_radix.ENTRY_POINT_GROUP)
        if ep.name == warmup_radix.ENTRY_POINT_NAME
    ]
    if not ours or ours[0].value != warmup_radix.ENTRY_POINT_VALUE:
        raise PatchNotReachable(
            f"SGLang's plugin loader cannot find moa-pd's warm-up hook: install this project into "
            f"the SGLang environment (pip install -e '.[sglang]') so that its entry point "
            f'[project.entry-points."{warmup_radix.ENTRY_POINT_GROUP}"] '
            f'{warmup_radix.ENTRY_POINT_NAME} = "{warmup_radix.ENTRY_POINT_VALUE}" is registered'
        )
    allowed = [x.strip() for x in env.get("SGLANG_PLUGINS", "").split(",") if x.strip()]
    if allowed and warmup_radix.ENTRY_POINT_NAME not in allowed:
        raise PatchNotReachable(
            f"SGLANG_PLUGINS={env['SGLANG_PLUGINS']!r} whitelists plugins without moa-pd's; add "
            f"{warmup_radix.ENTRY_POINT_NAME} to it or unset it"
        )


def _check_fake_host() -> None:
    # The plugin checks this too, but SGLang only logs a failing plugin: fail loudly here instead.
    from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST

    from sglang_ext import protocol as P

    if FAKE_BOOTSTRAP_HOST != P.FAKE_BOOTSTRAP_HOST:
        raise PatchNotReachable(
            f"SGLang's FAKE_BOOTSTRAP_HOST is {FAKE_BOOTSTRAP_HOST!r}, protocol.py says "
            f"{P.FAKE_BOOTSTRAP_HOST!r}: warm-ups would not be recognised"
        )


def apply(version: str | None = None) -> list[Patch]:
    """Apply the plan for `version` (default: the installed SGLang) and return it.

    Raises UnsupportedSGLangVersion outside 0.5.3..0.5.23 and PatchNotReachable when a
    scheduler-side patch could not be loaded by SGLang. Imports SGLang's HTTP server module.
    """
    version = version or installed_version()
    plan = patch_plan(version)
    for patch in plan:
        if patch.name == WARMUP_RADIX_INSERT:
            check_plugin_reachable()
            _check_fake_host()
            # Inherited by every process SGLang spawns; the plugin is inert without it.
            os.environ[warmup_radix.ENABLE_ENV] = "1"
        elif patch.name == PREFILL_ONLY_ROUTE:
            from sglang.srt.entrypoints import http_server

            prefill_only_route.install(http_server.app, dp_rank_field(version))
        # WARNING, not INFO: this runs before SGLang configures logging, and Python's
        # last-resort handler drops anything below WARNING, so an operator could not tell.
        logger.warning(
            "moa-pd patch %s applied for SGLang %s (%s)", patch.name, version, patch.process
        )
    return plan
