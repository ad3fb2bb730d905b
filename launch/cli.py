"""The `moa-pd` command line: one subcommand per job, each in the module that does the work.

Exit codes: 0 ok, 1 a run failed, 2 bad input (a config, a flag, a path). Bad input never prints
a traceback: the message names the file, the JSON path and the fix.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from router.config_loader import ConfigError


def _cmd_validate(args: argparse.Namespace) -> int:
    from router.config_loader import load_config

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


def _cmd_show(args: argparse.Namespace) -> int:
    from launch.show import render_graph
    from router.config_loader import load_config

    if bool(args.config) == bool(args.config_opt):
        print(
            "error: name one config, as `moa-pd show CONFIG` or `--config CONFIG`", file=sys.stderr
        )
        return 2
    print(render_graph(load_config(args.config or args.config_opt)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="moa-pd", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="check topology configs without starting anything")
    p.add_argument(
        "configs", nargs="*", metavar="CONFIG", help="a config file's path or a cfgs/ name"
    )
    p.add_argument("--config", action="append", help="a config (path or name), repeatable")
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser("show", help="print a topology's graph: layers, clusters, who reads whom")
    p.add_argument("config", nargs="?", metavar="CONFIG", help="a config file's path or a name")
    p.add_argument("--config", dest="config_opt", metavar="CONFIG", help="the same, as an option")
    p.set_defaults(func=_cmd_show)

    _add_optional_commands(sub)
    return parser


def _add_optional_commands(sub) -> None:
    """Subcommands whose modules register themselves (launcher, runner, figures, demo)."""
    import importlib

    modules = (
        "launch.commands",
        "launch.dummy_model_cmd",
        "planning.command",
        "profiling.commands",
        "simulation.command",
    )
    for module in (*modules, "experiments.commands"):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            continue
        mod.register(sub)


def _sigterm_as_sigint(signum, frame) -> None:
    """SIGTERM stops a command the way Ctrl-C does (asyncio's own SIGINT handling included):
    what it started is torn down, results written so far stay valid."""
    signal.raise_signal(signal.SIGINT)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for "resume with: ..." hints
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _sigterm_as_sigint) if main_thread else None
    if main_thread and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # A shell without job control starts `cmd &` with SIGINT ignored, and Python keeps that:
        # SIGTERM's re-raised SIGINT would then be dropped and the run go on. A background job
        # gets no Ctrl-C from the terminal anyway, so the default handler changes nothing else.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return args.func(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
