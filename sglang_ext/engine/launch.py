"""`main(argv)`: start one torch-backend worker (`--backend torch`) from an SGLang command line.

Called by `python -m sglang_ext.engine.launch ...` and by the `sglang_ext.launch_server` dispatcher.
"""

from __future__ import annotations

import logging
import sys

from aiohttp import web

from sglang_ext.server_args import UnsupportedFlagError, parse_args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except (UnsupportedFlagError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from sglang_ext.engine.server import make_app

    logging.getLogger(__name__).info(
        "torch worker %s:%d mode=%s model=%s",
        args.host,
        args.port,
        args.disaggregation_mode,
        args.model_path,
    )
    web.run_app(
        make_app(args),
        host=args.host,
        port=args.port,
        print=None,
        access_log=None,
        handle_signals=True,
        shutdown_timeout=2,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
