"""`moa-pd validate`: check topology configs without starting anything; exit 2 and a message
naming the file, the JSON path and the fix for each config that is wrong."""

from __future__ import annotations

import argparse
import sys

from router.config_loader import ConfigError, load_config


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "configs", nargs="*", metavar="CONFIG", help="a config file's path or a cfgs/ name"
    )
    p.add_argument("--config", action="append", help="a config (path or name), repeatable")


def main(args: argparse.Namespace) -> int:
    failed = 0
    paths = args.configs + (args.config or [])
    if not paths:
        print("error: name at least one config (a path or a cfgs/ name)", file=sys.stderr)
        return 2
    for path in paths:
        try:
            cfg = load_config(path)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            failed += 1
        else:
            print(f"ok: {path} ({cfg.name}: {len(cfg.agents)} agents, final '{cfg.final}')")
    return 2 if failed else 0
