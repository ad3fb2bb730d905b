"""The experiment subcommands of `moa-pd` (launch/cli.py calls `register`). Each handler lives
in its own module exposing `add_arguments(parser)` and `main(args) -> int`; to add one, append a
row to `_COMMANDS`."""

from __future__ import annotations

import argparse
import importlib

# (subcommand, module, one-line help)
_COMMANDS = (
    (
        "demo",
        "experiments.demo",
        "the CPU default end to end: a few GSM8K questions through settings #1-#4, table, figures",
    ),
    (
        "run",
        "experiments.run_cmd",
        "run the paper's settings #1-#4 on a dataset; write results.jsonl, summary and figures",
    ),
    (
        "plot",
        "experiments.plot_cmd",
        "rebuild summary.json, the table and the figures of a run folder from results.jsonl",
    ),
    (
        "sweep",
        "experiments.sweep",
        "run configs x datasets x settings x chunk policies from a spec; write sweep.csv",
    ),
    (
        "train-scorer",
        "routing.train_cmd",
        "fit the routing scorer (scorer.json) on setting-#5 runs; print its held-out AUC and Brier",
    ),
)


def register(sub: argparse._SubParsersAction) -> None:
    for name, module_name, help_text in _COMMANDS:
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=help_text, description=module.__doc__)
        module.add_arguments(p)
        p.set_defaults(func=module.main)
