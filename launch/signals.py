"""SIGTERM stops a command the way Ctrl-C does (asyncio's own SIGINT handling included): what it
started is torn down, and results written so far stay valid. For `moa-pd` and the benchmark
scripts alike; `timeout` and the end of a batch job send SIGTERM."""

from __future__ import annotations

import signal
from collections.abc import Callable


def _sigterm_as_sigint(signum, frame) -> None:
    signal.raise_signal(signal.SIGINT)


def sigterm_as_ctrl_c() -> Callable[[], None]:
    """Install the handler (main thread only); returns what puts the previous SIGTERM one back."""
    previous = signal.signal(signal.SIGTERM, _sigterm_as_sigint)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # A shell without job control starts `cmd &` with SIGINT ignored, and Python keeps that:
        # SIGTERM's re-raised SIGINT would then be dropped and the run go on. A background job
        # gets no Ctrl-C from the terminal anyway, so the default handler changes nothing else.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return lambda: signal.signal(signal.SIGTERM, previous)
