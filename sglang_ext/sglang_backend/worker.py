"""The `--backend sglang` worker: check the SGLang version, apply the patch, run SGLang's server.

Called by `sglang_ext.launch_server` with every argument but `--backend`; all of them except
`--dry-run` are SGLang's own flags, handed to `sglang.launch_server` unchanged.
"""

from __future__ import annotations

import argparse
import os
import runpy
import shlex
import sys

from sglang_ext.patch import apply, patch_plan
from sglang_ext.patch.apply import PatchNotReachable
from sglang_ext.patch.version import MAX_SUPPORTED, UnsupportedSGLangVersion, installed_version


class UnsupportedOption(ValueError):
    """An SGLang option under which the patch would silently not apply."""


def _flag_value(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def check_options(sglang_args: list[str], env: dict[str, str]) -> None:
    """Refuse set-ups where the /prefill_only route would not be on the serving HTTP app."""
    workers = _flag_value(sglang_args, "--tokenizer-worker-num")
    if workers is not None and workers != "1":
        raise UnsupportedOption(
            f"--tokenizer-worker-num {workers}: extra tokenizer workers re-import SGLang's HTTP "
            "app in their own processes, without /prefill_only; use 1 (the default)"
        )
    if env.get("SGLANG_RUST_SERVER", "").lower() in ("1", "true", "yes"):
        raise UnsupportedOption(
            "SGLANG_RUST_SERVER is set: the Rust HTTP server has no /prefill_only route; unset it"
        )
    grpc = {"--grpc-mode", "--smg-grpc-mode", "--encoder-only"} & set(sglang_args)
    if grpc:
        raise UnsupportedOption(f"{sorted(grpc)}: no HTTP app to mount /prefill_only on")


def with_metrics(sglang_args: list[str]) -> list[str]:
    """SGLang's args plus `--enable-metrics`: without it SGLang puts no timing into meta_info
    (queue_time, forward_entry_time, prefill_finished_time, request_received_ts, ...), and the
    router's breakdown of each request's time to first token would be all unknown."""
    return sglang_args if "--enable-metrics" in sglang_args else [*sglang_args, "--enable-metrics"]


def _dry_run(sglang_args: list[str]) -> None:
    try:
        version, note = installed_version(), ""
    except UnsupportedSGLangVersion:
        version, note = str(MAX_SUPPORTED), " (sglang not installed here; plan shown for it)"
    print(f"sglang {version}{note}")
    for patch in patch_plan(version):
        print(f"patch {patch.name} [{patch.process}]: {patch.reason}")
    print(shlex.join([sys.executable, "-m", "sglang.launch_server", *sglang_args]))


def main(argv: list[str]) -> int:
    """Run one SGLang worker with the patch applied; returns an exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m sglang_ext.launch_server --backend sglang",
        add_help=False,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the patch plan and the SGLang command line, run nothing",
    )
    ours, sglang_args = parser.parse_known_args(argv)
    sglang_args = with_metrics(sglang_args)
    try:
        check_options(sglang_args, dict(os.environ))
        if ours.dry_run:
            _dry_run(sglang_args)
            return 0
        apply(installed_version())
    except (UnsupportedSGLangVersion, PatchNotReachable, UnsupportedOption) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # SGLang's own entry runs as __main__ (alter_sys: spawned schedulers then re-import
    # sglang.launch_server as their __mp_main__, exactly as under `python -m sglang.launch_server`).
    sys.argv = ["sglang.launch_server", *sglang_args]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
    return 0
