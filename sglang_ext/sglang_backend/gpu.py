"""Real SGLang on NVIDIA GPUs: the attention flags a worker needs with the installed kernels.

SGLang's default attention on Hopper is FlashAttention 3, which lives in `sgl_kernel.flash_ops`;
offline wheel sets often trim that 342 MB library (../shared/reference/gpu-offline.md), and FA3
runs only on sm90. Without it every server needs triton attention, PyTorch sampling and no CUDA
graphs. `worker_flags(argv)` is what `moa-pd up`, the microbench and the GPU tests add to a
worker's command line; flags the config already sets are left as they are.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import shutil
import subprocess
from pathlib import Path

logger = logging.getLogger(__name__)

# nvidia-smi answers in well under a second; a hung driver must not hang the launcher.
SMI_TIMEOUT_S = 10.0
# What a worker runs with when FA3 is missing (measured working on an H200, SGLang 0.5.17).
TRITON_FLAGS: tuple[str, ...] = (
    "--attention-backend",
    "triton",
    "--sampling-backend",
    "pytorch",
    "--disable-cuda-graph",
)
FA3_FLAGS: tuple[str, ...] = ("--attention-backend", "fa3")


@functools.cache
def fa3_library_installed() -> bool:
    """True when the installed sgl_kernel ships `flash_ops` (found without importing it)."""
    spec = importlib.util.find_spec("sgl_kernel")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(
        next(Path(d).rglob("flash_ops*"), None) is not None for d in spec.submodule_search_locations
    )


@functools.cache
def gpus_are_hopper() -> bool:
    """Every visible GPU is sm90 (FA3's only target); False if nvidia-smi cannot say. Asked here
    rather than through planning/gpus.py: sglang_ext does not import planning/."""
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
            timeout=SMI_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as e:  # a wedged driver hangs nvidia-smi
        logger.warning("nvidia-smi gave no compute capability (%s): assuming no FA3", e)
        return False
    caps = [c.strip() for c in out.stdout.splitlines() if c.strip()]
    return out.returncode == 0 and bool(caps) and all(c.startswith("9.") for c in caps)


def has_fa3() -> bool:
    return fa3_library_installed() and gpus_are_hopper()


def attention_backend() -> str:
    """ "fa3" or "triton": what a GPU worker started here runs."""
    return "fa3" if has_fa3() else "triton"


def worker_flags(argv: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The attention flags for a GPU worker whose command line so far is argv: none with FA3
    (SGLang's default), the triton set without it, minus any flag argv already has."""
    if has_fa3():
        return []
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    out: list[str] = []
    flags = list(TRITON_FLAGS)
    while flags:
        flag = flags.pop(0)
        value = [flags.pop(0)] if flags and not flags[0].startswith("--") else []
        if flag not in given:
            out += [flag, *value]
    return out
