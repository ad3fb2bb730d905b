"""What every benchmark report says about its own run: the command that reproduces it, the
device, and the load average and the machine's speed before and after. On a 2-core machine a
ratio is only worth something if nothing else was running, so the load average travels with
each number; and a cloud VM's own speed moves by up to 20× within hours
(`benchmarks/machine_speed.py`), so the time of a decode-shaped pass travels with it too."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def cpu_device(pinned: bool = False) -> str:
    return f"CPU, torch backend, {os.cpu_count()} cores" + (", workers pinned" if pinned else "")


def device_name() -> str:
    """The GPUs nvidia-smi lists (name and memory, e.g. "1x NVIDIA H200 (143771 MiB)"), else
    the CPU: every GPU number is labelled with its card."""
    if shutil.which("nvidia-smi"):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        cards = [line.strip() for line in out.splitlines() if line.strip()]
        if cards:
            names = sorted(set(cards))
            return ", ".join(
                f"{cards.count(n)}x {n.split(',')[0]} ({n.split(',')[1].strip()})" for n in names
            )
    return cpu_device()


def _speed() -> float:
    from benchmarks.machine_speed import decode_pass_ms

    return round(decode_pass_ms(), 1)


@dataclass
class BenchRun:
    """Started before the deployment comes up; `meta()` is called once the measurements end.
    `speed_before` None: no speed probe (before or after)."""

    module: str
    argv: list[str] = field(default_factory=lambda: sys.argv[1:])
    load_before: str = field(default_factory=_load)
    speed_before: float | None = field(default_factory=_speed)

    @property
    def command(self) -> str:
        return " ".join(["python -m", self.module, shlex.join(self.argv)]).rstrip()

    def started(self, **extra) -> dict:
        """What is known before the measurements: a benchmark that can be stopped midway keeps it
        beside its rows, so a report rebuilt from them still says where they came from."""
        speed = {} if self.speed_before is None else {"decode_pass_ms_before": self.speed_before}
        return {"command": self.command, "load_before": self.load_before, **speed, **extra}

    def meta(self, **extra) -> dict:
        after = {"load_after": _load()}
        if self.speed_before is not None:
            after["decode_pass_ms_after"] = _speed()
        return self.started(**extra) | after


def provenance(meta: dict) -> str:
    """The report line that makes a number reproducible."""
    stopped = "not recorded (the run stopped before its end)"
    speed = ""
    if "decode_pass_ms_before" in meta:
        after = meta.get("decode_pass_ms_after")
        speed = (
            f"; a decode-shaped pass (benchmarks/machine_speed.py) {meta['decode_pass_ms_before']}"
            f" ms before, " + (f"{after} ms after" if after is not None else f"after {stopped}")
        )
    return (
        f"Command: `{meta['command']}`; load average before {meta['load_before']}, "
        f"after {meta.get('load_after', stopped)}{speed}."
    )
