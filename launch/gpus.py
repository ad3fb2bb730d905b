"""GPU assignment for the sglang backend: one GPU per worker, the ones with most free memory."""

from __future__ import annotations

import shutil
import subprocess

from launch.procs import LaunchError


def has_nvidia_gpus() -> bool:
    return shutil.which("nvidia-smi") is not None


def free_memory_by_gpu() -> dict[int, int]:
    """{gpu index: free MiB} from nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        raise LaunchError(
            "--backend sglang needs NVIDIA GPUs, but nvidia-smi is not on PATH; "
            "use --backend torch on machines without a GPU"
        )
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,memory.free", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return parse_nvidia_smi(out)


def parse_nvidia_smi(text: str) -> dict[int, int]:
    gpus = {}
    for line in text.strip().splitlines():
        index, free = (x.strip() for x in line.split(","))
        gpus[int(index)] = int(free)
    return gpus


def assign_gpus(n_workers: int, free_mib: dict[int, int]) -> list[int]:
    """The n_workers GPUs with the most free memory, most free first."""
    if n_workers > len(free_mib):
        raise LaunchError(
            f"the deployment needs {n_workers} GPUs (one per worker) but {len(free_mib)} are "
            "visible; lower workers.prefill/decode in the config or use more GPUs"
        )
    return sorted(free_mib, key=lambda i: (-free_mib[i], i))[:n_workers]
