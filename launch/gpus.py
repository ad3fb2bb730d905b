"""The GPUs placement may use: nvidia-smi's table (index, name, total and free MiB), narrowed by
`--gpus`, or an assumed one (`--gpu-memory 2x80GiB`) to plan on a machine without GPUs."""

from __future__ import annotations

import re
import shutil
import subprocess

from launch.procs import LaunchError
from planning.types import GPU

QUERY = "--query-gpu=index,name,memory.total,memory.free"


def has_nvidia_gpus() -> bool:
    return shutil.which("nvidia-smi") is not None


def query_gpus() -> list[GPU]:
    """Every GPU nvidia-smi lists, with the memory free now."""
    if shutil.which("nvidia-smi") is None:
        raise LaunchError(
            "--backend sglang needs NVIDIA GPUs, but nvidia-smi is not on PATH; "
            "use --backend torch on machines without a GPU, or plan with --gpu-memory 1x80GiB"
        )
    try:
        out = subprocess.run(
            ["nvidia-smi", QUERY, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        raise LaunchError(f"nvidia-smi failed: {getattr(e, 'stderr', '') or e}") from None
    return parse_nvidia_smi(out)


def parse_nvidia_smi(text: str) -> list[GPU]:
    """`index, name, memory.total, memory.free` CSV rows (MiB, no units) -> GPUs."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [x.strip() for x in line.split(",")]
        try:
            # A GPU's name may hold a comma: index first, the two memory columns last.
            total, free = int(parts[-2]), int(parts[-1])
            gpus.append(GPU(int(parts[0]), ", ".join(parts[1:-2]), total, free))
        except (ValueError, IndexError):
            raise LaunchError(
                f"cannot read nvidia-smi's line {line!r} (expected index, name, total, free)"
            ) from None
    return gpus


def assumed_gpus(spec: str) -> list[GPU]:
    """`--gpu-memory 2x80GiB` (or 80GB, 81920MiB; N defaults to 1): identical, empty GPUs."""
    m = re.fullmatch(r"(?:(\d+)x)?(\d+(?:\.\d+)?)\s*(GiB|GB|MiB|MB)", spec.strip(), re.IGNORECASE)
    if not m or int(m.group(1) or 1) < 1:
        raise LaunchError(f"--gpu-memory {spec!r}: write N x memory, e.g. 2x80GiB or 1x141GB")
    count, size, unit = int(m.group(1) or 1), float(m.group(2)), m.group(3).lower()
    mib = int(size * {"gib": 1024, "gb": 1e9 / 2**20, "mib": 1, "mb": 1e6 / 2**20}[unit])
    return [GPU(i, f"assumed {spec}", mib, mib) for i in range(count)]


def select_gpus(gpus: list[GPU], wanted: str | None) -> list[GPU]:
    """`--gpus 0,2`: only those (by nvidia-smi index); None: all."""
    if not wanted:
        return gpus
    try:
        ids = [int(x) for x in wanted.split(",") if x.strip()]
    except ValueError:
        raise LaunchError(f"--gpus {wanted!r}: give GPU indices like 0,1") from None
    known = {g.index: g for g in gpus}
    missing = [i for i in ids if i not in known]
    if missing:
        raise LaunchError(
            f"--gpus names GPU {missing[0]}, but the GPUs here are {sorted(known) or 'none'}"
        )
    return [known[i] for i in dict.fromkeys(ids)]
