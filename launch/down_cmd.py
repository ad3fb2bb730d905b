"""`moa-pd down`: stop what a detached `moa-pd up` started in a run folder, and nothing else."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from launch.procs import LaunchError
from launch.run_dir import down_run_dir

console = Console(stderr=True, soft_wrap=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-dir", required=True, help="the run folder `moa-pd up --detach` wrote")


def main(args: argparse.Namespace) -> int:
    try:
        names = down_run_dir(Path(args.run_dir))
    except LaunchError as e:
        console.print(f"[red]error:[/red] {e}")
        return 2
    if not names:
        console.print(f"nothing is running in {args.run_dir}: its deployment was stopped already")
        return 0
    console.print(f"stopped {len(names)} processes: {', '.join(names)}")
    return 0
