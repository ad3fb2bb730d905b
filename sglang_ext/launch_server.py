"""`python -m sglang_ext.launch_server [--backend {torch,sglang}] ...`: start one worker.

`--backend torch` (default) runs the CPU reference engine, `--backend sglang` real SGLang with the
moa-pd patch; every other argument goes to the chosen backend unchanged.
"""

from __future__ import annotations

import argparse
import sys

BACKENDS = ("torch", "sglang")


def split_backend(argv: list[str]) -> tuple[str, list[str]]:
    """Pull `--backend` out of argv; returns (backend, the backend's own arguments)."""
    # add_help=False: -h/--help belongs to the backend's parser; allow_abbrev=False: never
    # swallow a backend flag that merely starts with "--b".
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--backend", choices=BACKENDS, default="torch")
    ours, rest = parser.parse_known_args(argv)
    return ours.backend, rest


def main(argv: list[str] | None = None) -> int:
    backend, rest = split_backend(sys.argv[1:] if argv is None else argv)
    # Imported lazily: the torch engine pulls in torch, the sglang worker pulls in SGLang.
    if backend == "sglang":
        from sglang_ext.sglang_backend.worker import main as sglang_main

        return sglang_main(rest)
    from sglang_ext.engine.launch import main as torch_main

    return torch_main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
