"""What a profile says about where it was measured: the device, the packages' versions, the
host and the time."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import shutil
import socket
from pathlib import Path

import psutil

from profiling.profile_file import DeviceInfo, Profile

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


def elsewhere(profile: Profile) -> str | None:
    """Why `profile` may not describe this machine, or None: a CPU profile measured on another
    CPU model or core count, or with another version of the backend's package; a GPU profile of
    other GPUs than this machine has (a machine without GPUs plans for GPUs elsewhere: no
    warning)."""
    dev = profile.device
    if dev.kind == "cuda":
        if shutil.which("nvidia-smi") is None:
            return None
        here = device_info(cuda=True)
        if here.kind == "cuda" and here.name != dev.name:
            return f"it was measured on {dev.name}, this machine has {here.name}"
        return None
    here = device_info(cuda=False)
    if dev.name != here.name or (dev.cores is not None and dev.cores != here.cores):
        return (
            f"it was measured on {dev.name} ({dev.cores} cores), this machine has {here.name} "
            f"({here.cores} cores)"
        )
    package = "torch" if profile.backend == "torch" else "sglang"
    made, installed = profile.versions.get(package), versions().get(package)
    if made and installed and made != installed:
        return f"it was measured with {package} {made}, this machine has {installed}"
    return None


def profile_warning(profile: Profile, path: str) -> str | None:
    """The warning `simulate`, `plan` and `validate` print when the profile is from elsewhere."""
    why = elsewhere(profile)
    if why is None:
        return None
    return (
        f"warning: the profile {path} may not fit this machine: {why}. Predictions use its "
        "costs as they are; run `moa-pd profile` here first for predictions of this machine"
    )


def warn_if_elsewhere(profile: Profile, path: str) -> None:
    """Print `profile_warning` to stderr, if any."""
    from rich.console import Console
    from rich.markup import escape

    warning = profile_warning(profile, path)
    if warning is not None:
        Console(stderr=True, soft_wrap=True).print(f"[yellow]{escape(warning)}[/yellow]")
