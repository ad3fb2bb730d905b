"""The `moa-pd` command line: one subcommand per job, each in the module that does the work.

Exit codes: 0 ok, 1 a run failed, 2 bad input (a config, a flag, a path). Bad input never prints
a traceback: the message names the file, the JSON path and the fix.

A subcommand's module is imported only when that subcommand runs (as git and pip do): `moa-pd
--help`, `down`, `show` and `validate` stay free of torch, transformers and scipy, which would
cost seconds per start. Each module exposes `add_arguments(parser)` and `main(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import threading
from collections.abc import Iterable

from launch.signals import sigterm_as_ctrl_c
from router.config_loader import ConfigError

# subcommand -> (module, one-line help), in the order `moa-pd --help` lists them
COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("launch.validate_cmd", "check topology configs without starting anything"),
    "show": ("launch.show", "print a topology's graph: layers, clusters, who reads whom"),
    "up": ("launch.commands", "start workers, native routers and the shell router"),
    "down": ("launch.down_cmd", "stop what `moa-pd up --detach` started"),
    "plan": (
        "planning.command",
        "place workers by memory, or solve placement and replication from a profile (MILP)",
    ),
    "profile": (
        "profiling.commands",
        "measure each model of a config on this machine (prefill, decode, PD cost)",
    ),
    "simulate": (
        "simulation.command",
        "predict latency and throughput from a profile; --validate compares with measured runs",
    ),
    "dummy-model": (
        "launch.dummy_model_cmd",
        "write a shape-only model directory (random weights via --load-format dummy)",
    ),
    "demo": (
        "experiments.demo",
        "the CPU default end to end: a few GSM8K questions through settings #1-#4, table, figures",
    ),
    "run": (
        "experiments.run_cmd",
        "run the paper's settings #1-#4 on a dataset; write results.jsonl, summary and figures",
    ),
    "plot": (
        "experiments.plot_cmd",
        "rebuild summary.json, the table and the figures of a run folder from results.jsonl",
    ),
    "sweep": (
        "experiments.sweep",
        "run configs x datasets x settings x chunk policies from a spec; write sweep.csv",
    ),
    "train-scorer": (
        "routing.train_cmd",
        "fit the routing scorer (scorer.json) on setting-#5 runs; print its held-out AUC and Brier",
    ),
}


def build_parser(load: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The parser with every subcommand listed; the flags of the subcommands in `load` (all of
    them when None) are added, which imports their modules."""
    parser = argparse.ArgumentParser(prog="moa-pd", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if load is None or name in load:
            module = importlib.import_module(module_name)
            if module.__doc__:
                p.description = module.__doc__
            module.add_arguments(p)
            p.set_defaults(func=module.main)
    return parser


def _command_in(argv: list[str]) -> str | None:
    """The subcommand argv names (its first word; `moa-pd` takes no options before it but -h)."""
    return argv[0] if argv and argv[0] in COMMANDS else None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_in(argv)
    args = build_parser([command] if command else []).parse_args(argv)
    args.argv = argv  # for "resume with: ..." hints
    main_thread = threading.current_thread() is threading.main_thread()
    restore = sigterm_as_ctrl_c() if main_thread else None
    try:
        return args.func(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if restore:
            restore()


if __name__ == "__main__":
    sys.exit(main())
