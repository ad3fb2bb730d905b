"""IFBench instruction registry: instruction id -> our checker function, and coverage.

Called by `experiments.scoring.ifbench`; the id list comes from the vendored
`experiments/data/ifbench/instruction_registry.json` (the benchmark's own registry keys).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from experiments.datasets import data_dir
from experiments.scoring.ifbench import count, custom, formatting, ratio, repeat, sentence, words

Checker = Callable[..., bool]


class Coverage(NamedTuple):
    implemented: int
    total: int


def registry_path() -> Path:
    return data_dir() / "ifbench" / "instruction_registry.json"


def ids_in_test_set(path: Path | None = None) -> list[str]:
    """The instruction ids the 300-prompt test set uses (58)."""
    with (path or registry_path()).open(encoding="utf-8") as f:
        return list(json.load(f)["used_in_test"])


def all_ids(path: Path | None = None) -> list[str]:
    """Every id in the benchmark's registry (83: 25 IFEval + 58 IFBench)."""
    with (path or registry_path()).open(encoding="utf-8") as f:
        return [entry["instruction_id"] for entry in json.load(f)["registry"]]


def checkers() -> dict[str, Checker]:
    """Every implemented checker by instruction id."""
    table: dict[str, Checker] = {}
    for module in (count, custom, formatting, ratio, repeat, sentence, words):
        table.update(module.CHECKERS)
    return table


def checker_for(instruction_id: str) -> Checker | None:
    """The checker for an id, or None when it is not implemented (reported as not covered)."""
    return checkers().get(instruction_id)


def missing(path: Path | None = None) -> list[str]:
    """Test-set ids without a checker."""
    have = checkers()
    return [i for i in ids_in_test_set(path) if i not in have]


def coverage(path: Path | None = None) -> Coverage:
    """How many of the test set's instruction ids have a checker."""
    ids = ids_in_test_set(path)
    have = checkers()
    return Coverage(implemented=sum(1 for i in ids if i in have), total=len(ids))
