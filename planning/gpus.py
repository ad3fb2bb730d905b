"""The GPUs placement may use: nvidia-smi's table (index, name, total and free MiB), narrowed to
an inherited CUDA_VISIBLE_DEVICES and by `--gpus`, or an assumed one (`--gpu-memory 2x80GiB`) to
plan on a machine without GPUs. Facts about the machine, not about launching: `moa-pd plan` reads
them here, and launch/ (which executes plans) and profiling/ import them from here. Errors are
PlanError, which launch/ turns into its LaunchError."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from planning.pack import PlanError
from planning.types import GPU

QUERY = "--query-gpu=index,name,memory.total,memory.free"


def has_nvidia_gpus() -> bool:
    return shutil.which("nvidia-smi") is not None


def query_gpus() -> list[GPU]:
    """Every GPU nvidia-smi lists, with the memory free now; only those an inherited
    CUDA_VISIBLE_DEVICES names, where it is set (visible_indices)."""
    if shutil.which("nvidia-smi") is None:
        raise PlanError(
            "--backend sglang needs NVIDIA GPUs, but nvidia-smi is not on PATH; "
            "use --backend torch on machines without a GPU, or plan with --gpu-memory 1x80GiB"
        )
    gpus = parse_nvidia_smi(_nvidia_smi(QUERY))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return gpus
    by_index = {g.index: g for g in gpus}
    return [by_index[i] for i in visible_indices(visible, gpus)]


def _nvidia_smi(query: str) -> str:
    try:
        return subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        raise PlanError(f"nvidia-smi failed: {getattr(e, 'stderr', '') or e}") from None


def visible_indices(visible: str, gpus: list[GPU]) -> list[int]:
    """The nvidia-smi indices of the GPUs CUDA_VISIBLE_DEVICES=`visible` names, in its order.

    nvidia-smi ignores CUDA_VISIBLE_DEVICES, and placed workers get their own
    (CUDA_DEVICE_ORDER=PCI_BUS_ID, CUDA_VISIBLE_DEVICES=<their GPUs>), so the user's would be
    lost: placement keeps to the GPUs it names instead. Entries are indices, read in nvidia-smi's
    (PCI bus) order, which is CUDA's under CUDA_DEVICE_ORDER=PCI_BUS_ID and on a node of one GPU
    model; GPU UUIDs (GPU-..., or a unique prefix, as CUDA accepts) are looked up in nvidia-smi.
    MIG instances (MIG-...) cannot be placed on and are refused."""
    entries = [e.strip() for e in visible.split(",")]
    if not any(entries):
        raise PlanError(
            "CUDA_VISIBLE_DEVICES is set but empty, so CUDA sees no GPU; unset it, or list the "
            "GPUs to use (e.g. CUDA_VISIBLE_DEVICES=0,1, or --gpus 0,1)"
        )
    uuids: dict[str, int] | None = None
    indices: list[int] = []
    for entry in entries:
        if entry.isdigit():
            index = int(entry)
        elif entry.upper().startswith("GPU-"):
            if uuids is None:
                uuids = _uuids()
            found = [i for u, i in uuids.items() if u.lower().startswith(entry.lower())]
            index = found[0] if len(found) == 1 else -1
        else:
            raise PlanError(
                f"CUDA_VISIBLE_DEVICES={visible}: cannot place workers on {entry!r}; give GPU "
                "indices or GPU UUIDs (MIG instances are not supported), or unset it"
            )
        if index not in {g.index for g in gpus}:
            raise PlanError(
                f"CUDA_VISIBLE_DEVICES={visible} names {entry!r}, which is none of the GPUs "
                f"nvidia-smi lists ({sorted(g.index for g in gpus)}); fix or unset it"
            )
        indices.append(index)
    return list(dict.fromkeys(indices))


def _uuids() -> dict[str, int]:
    """{GPU UUID: nvidia-smi index}."""
    out = _nvidia_smi("--query-gpu=uuid,index")
    rows = [line.split(",") for line in out.splitlines() if line.strip()]
    try:
        return {uuid.strip(): int(index) for uuid, index in rows}
    except ValueError:
        raise PlanError(f"cannot read nvidia-smi's GPU UUIDs from {rows!r}") from None


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
            raise PlanError(
                f"cannot read nvidia-smi's line {line!r} (expected index, name, total, free)"
            ) from None
    return gpus


def assumed_gpus(spec: str) -> list[GPU]:
    """`--gpu-memory 2x80GiB` (or 80GB, 81920MiB; N defaults to 1): identical, empty GPUs."""
    m = re.fullmatch(r"(?:(\d+)x)?(\d+(?:\.\d+)?)\s*(GiB|GB|MiB|MB)", spec.strip(), re.IGNORECASE)
    if not m or int(m.group(1) or 1) < 1:
        raise PlanError(f"--gpu-memory {spec!r}: write N x memory, e.g. 2x80GiB or 1x141GB")
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
        raise PlanError(f"--gpus {wanted!r}: give GPU indices like 0,1") from None
    known = {g.index: g for g in gpus}
    missing = [i for i in ids if i not in known]
    if missing:
        raise PlanError(
            f"--gpus names GPU {missing[0]}, but the GPUs here are {sorted(known) or 'none'}"
        )
    return [known[i] for i in dict.fromkeys(ids)]
