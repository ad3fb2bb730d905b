"""What a profile says about where it was measured: the device, the packages' versions, the
host and the time."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import socket
from pathlib import Path

import psutil

from profiling.profile_file import DeviceInfo

PACKAGES = ("moa-pd", "torch", "sglang", "sglang-router", "transformers")


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_info(cuda: bool) -> DeviceInfo:
    """The GPUs the workers could use (nvidia-smi, narrowed by CUDA_VISIBLE_DEVICES) when
    `cuda`, else the CPU: its model name, the cores this process may run on, the machine's."""
    cores = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    if cuda:
        from planning.gpus import query_gpus

        gpus = query_gpus()
        if gpus:
            names = sorted({g.name for g in gpus})
            return DeviceInfo(
                kind="cuda",
                name=", ".join(names),
                count=len(gpus),
                memory_mib=min(g.total_mib for g in gpus),
                cores=cores,
            )
    return DeviceInfo(kind="cpu", name=cpu_name(), count=len(os.sched_getaffinity(0)), cores=cores)


def versions() -> dict[str, str]:
    """Installed versions of the packages a profile's numbers depend on (absent ones left out)."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def now_utc() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def host() -> str:
    return socket.gethostname()
