"""`python -m launch.native_router ARGS`: the real sglang-router (its Rust router, SGLang's own
command line) started without importing SGLang.

sglang_router.launch_router imports its debugging load balancer (mini_lb), which imports
sglang.srt.tracing whenever SGLang is installed, and with it all of SGLang: ~14 s of CPU (~45 s
on a loaded 2-core machine) before the router starts, for request tracing that no deployment of
ours turns on. Marking that one module as absent sends mini_lb down its own no-tracing path
(its ImportError branch); nothing of the Rust router changes.
"""

from __future__ import annotations

import sys


def main() -> None:
    # A None entry makes `from sglang.srt.tracing.trace import ...` raise ImportError at once,
    # before Python imports the parent packages (sglang/__init__ is the expensive part).
    sys.modules.setdefault("sglang.srt.tracing.trace", None)
    from sglang_router.launch_router import main as launch_router_main

    launch_router_main()


if __name__ == "__main__":
    main()
