"""The `moa-pd` command line: every subcommand is listed and loads its flags; the commands a user
runs to look around (`--help`, `down`, `show`, `validate`) start without importing torch,
transformers, sentence-transformers, scipy or scikit-learn (seconds per start otherwise), and
their messages are never hard-wrapped when stderr is not a terminal."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from launch.cli import COMMANDS, build_parser
from tests.project_packages import ALL_PACKAGES

HEAVY = ("torch", "transformers", "sentence_transformers", "scipy", "sklearn")

# Runs `moa-pd ARGS...` in this interpreter, then prints which heavy modules it had imported.
PROBE = """
import json, sys
from launch.cli import main
try:
    code = main(sys.argv[2:])
except SystemExit as e:
    code = e.code
heavy = json.loads(sys.argv[1])
print(json.dumps({"code": code, "imported": [m for m in heavy if m in sys.modules]}))
"""


def _probe(*argv: str, tmp_path=None) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(HEAVY), *argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    return json.loads(out.stdout.strip().splitlines()[-1]) | {"stderr": out.stderr}


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["down", "--help"],
        ["show", "tree_9_3_1_cpu"],
        ["validate", "tree_9_3_1_cpu", "all_to_all_9_9_1_cpu", "routed_pool_cpu"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_looking_around_imports_no_heavy_library(argv):
    got = _probe(*argv)
    assert got["code"] == 0, got["stderr"]
    assert got["imported"] == [], f"`moa-pd {' '.join(argv)}` imported {got['imported']}"


def test_down_of_a_folder_without_a_deployment_is_light_and_says_so(tmp_path):
    got = _probe("down", "--run-dir", str(tmp_path / ("x" * 120)), tmp_path=tmp_path)
    assert got["code"] == 2 and got["imported"] == []
    # One line whatever the path's length: rich does not wrap a message sent to a pipe.
    assert len(got["stderr"].strip().splitlines()) == 1, got["stderr"]


def test_every_subcommand_is_listed_and_loads_its_flags(capsys):
    parser = build_parser()  # every module imported: one missing add_arguments/main fails here
    # Imports are checked by tests/test_import_cycles.py; this table imports by name.
    assert not [m for m, _ in COMMANDS.values() if m.split(".")[0] == "benchmarks"]
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["--help"])
    assert e.value.code == 0
    listing = capsys.readouterr().out
    for name in COMMANDS:
        assert name in listing
        args = parser.parse_args([name, *_minimal_args(name)])
        assert callable(args.func), name


def _minimal_args(name: str) -> list[str]:
    """The least each subcommand's parser accepts (its required flags)."""
    return {
        "down": ["--run-dir", "d"],
        "plan": ["--config", "tree_3_1_cpu"],
        "profile": ["--config", "tree_3_1_cpu", "--out", "p.json"],
        "simulate": ["--config", "tree_3_1_cpu", "--profile", "p.json"],
        "dummy-model": ["--shape", "qwen3-8b", "--out", "d"],
        "run": ["--config", "tree_3_1_cpu", "--dataset", "gsm8k", "--out", "d"],
        "plot": ["d"],
        "sweep": ["spec.json"],
        "train-scorer": ["--results", "d", "--out", "s.json"],
    }.get(name, [])


def test_an_unknown_subcommand_is_named(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser([]).parse_args(["serve"])
    assert e.value.code == 2
    assert "invalid choice: 'serve'" in capsys.readouterr().err


def _consoles_without_soft_wrap() -> list[str]:
    """Every rich Console the code prints through, unless built with soft_wrap=True. Without it,
    rich hard-wraps at 80 columns when the stream is no terminal (a log, a pipe, CI): a message
    broken mid-phrase, which grep and tests then miss. `Console().width` (a probe of the
    terminal's width, printing nothing) is allowed."""
    root = Path(__file__).resolve().parents[1]
    found = []
    for package in ALL_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            probes = {
                id(node.value)
                for node in ast.walk(tree)
                if isinstance(node, ast.Attribute) and node.attr == "width"
            }
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and _named(node.func) == "Console"):
                    continue
                if id(node) in probes and not node.args and not node.keywords:
                    continue
                soft = any(
                    k.arg == "soft_wrap" and isinstance(k.value, ast.Constant) and k.value.value
                    for k in node.keywords
                )
                if not soft:
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def _named(func: ast.expr) -> str | None:
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)


def test_every_console_soft_wraps():
    assert _consoles_without_soft_wrap() == [], "add soft_wrap=True to these Console(...) calls"
