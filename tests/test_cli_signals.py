"""SIGTERM stops a `moa-pd` command the way Ctrl-C does, also when the command was started with
SIGINT ignored (what a shell without job control does to `moa-pd run ... &`)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

# A stand-in command (the real ones start deployments) that waits in asyncio as `moa-pd run`
# does; argv[1] == "ignored" starts it with SIGINT ignored.
SCRIPT = """
import argparse, asyncio, signal, sys
import launch.cli as cli

if sys.argv[1] == "ignored":
    signal.signal(signal.SIGINT, signal.SIG_IGN)

async def wait():
    print("ready", flush=True)
    await asyncio.sleep(60)

def parser(load=None):
    p = argparse.ArgumentParser()
    p.set_defaults(func=lambda args: asyncio.run(wait()))
    return p

cli.build_parser = parser
sys.exit(cli.main([]))
"""


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_sigterm_interrupts_a_command(sigint):
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, sigint],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=10)
        assert time.monotonic() - t0 < 5
        assert rc == 130 and "interrupted" in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
