"""`python -m router --cluster cluster.json --config cfgs/x.json ... --host H --port N
[--api-key-file F]`: serve the shell router over the PD deployments listed in the cluster file.
The API key comes from the file (mode 0600) or MOA_PD_API_KEY, never from the command line."""

from __future__ import annotations

import argparse
import logging

from aiohttp import web

from router.api_key import ENV_VAR, ApiKeyError, key_from_env, read_key_file
from router.api_request import ROUTERS
from router.cluster import load_cluster
from router.config_loader import ConfigError, load_configs_by_name
from router.early_exit_hook import EarlyExitHooks
from router.embedder import EmbedderError
from router.server import make_app

log = logging.getLogger("router")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m router", description=__doc__)
    ap.add_argument("--cluster", required=True, help="cluster JSON written by the launcher")
    ap.add_argument(
        "--config",
        action="append",
        default=[],
        help="topology config (path or cfgs/ name) to serve by name; repeatable",
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument(
        "--api-key-file",
        help=f"require the key in this file as a bearer token (else {ENV_VAR}, if set)",
    )
    ap.add_argument("--log-level", default="INFO")
    args = ap.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    cluster = load_cluster(args.cluster)
    try:
        api_key = read_key_file(args.api_key_file) if args.api_key_file else key_from_env()
    except ApiKeyError as e:
        log.error("%s", e)
        raise SystemExit(2) from None
    configs = load_configs_by_name(args.config)
    # Early exit on by default. The embedding model of every served config is loaded and run once
    # now: a broken one stops the router here (and `moa-pd up` with it), not inside a question.
    hooks = EarlyExitHooks()
    try:
        for warning in hooks.check(configs.values()):
            log.warning("early exit unavailable (its requests are refused): %s", warning)
    except EmbedderError as e:
        log.error("cannot serve early exit: %s", e)
        raise SystemExit(2) from None
    app = make_app(cluster, configs, early_exit_hook=hooks, api_key=api_key)
    try:  # every routed config's scorer and model sizes, now
        app[ROUTERS].check(configs.values())
    except ConfigError as e:
        log.error("cannot serve routing: %s", e)
        raise SystemExit(2) from None
    log.info("API key: %s", "required" if api_key else "none")
    # Cancel a handler when its client disconnects, so its agents and their worker requests stop.
    web.run_app(
        app,
        host=args.host,
        port=args.port,
        handler_cancellation=True,
        print=lambda *_: log.info("shell router on http://%s:%d", args.host, args.port),
    )


if __name__ == "__main__":
    main()
