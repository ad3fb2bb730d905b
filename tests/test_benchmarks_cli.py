"""benchmarks/ as a package of its own: every module imports, every script answers `--help` as
`python -m benchmarks.NAME --help` does (its `__main__` block, run in-process), the GPU script
parses and names modules that exist, and no product module imports `benchmarks` (DESIGN: the
benchmarks use the product, the product never imports them)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
GPU_SCRIPT = BENCH / "gpu" / "run_gpu_bench.sh"

# Modules with no command line of their own, and why.
NO_CLI = {
    "benchmarks": "the package",
    "benchmarks.gpu": "the package of the GPU benchmark (run_gpu_bench.sh, fit_config)",
    "benchmarks.bench_kv_transfer": "bench_engine's NIXL transfer timer for goal (d)",
    "benchmarks.bench_meta": "what every benchmark report says about its run: command, device, load",
    "benchmarks.microbench_deploy": "the deployments microbench, bench_engine and bench_sglang_cpu "
    "bring up",
    "benchmarks.ttft_summary": "bench_ttft's summary.json and ttft.md",
    "benchmarks.shell_routers": "the shell routers the router-behaviour benchmarks start",
    "benchmarks.variant_blocks": "the blocks-of-variants loop bench_priority, bench_warmup_cost "
    "and bench_start_order share",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = sorted(module_name(p) for p in BENCH.rglob("*.py"))
CLI_MODULES = [m for m in MODULES if m not in NO_CLI]


def has_main_block(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
        and any(
            isinstance(c, ast.Constant) and c.value == "__main__" for c in node.test.comparators
        )
        for node in tree.body
    )


def test_the_package_is_this_checkout_and_the_no_cli_list_is_exact():
    import benchmarks

    assert Path(benchmarks.__file__).resolve().parent == BENCH
    without_main = {
        module_name(p)
        for p in BENCH.rglob("*.py")
        if not has_main_block(ast.parse(p.read_text(), filename=str(p)))
    }
    assert without_main == set(NO_CLI), (
        "a script without `if __name__ == '__main__':`, or a stale entry"
    )
    assert CLI_MODULES, "no benchmark scripts found"


@pytest.mark.parametrize("name", MODULES)
def test_every_module_imports(name):
    importlib.import_module(name)


# runpy warns that the module (imported above) is already in sys.modules; harmless here.
@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")
@pytest.mark.parametrize("name", CLI_MODULES)
def test_every_script_answers_help(name, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module(name, run_name="__main__", alter_sys=True)
    assert exit_.value.code in (0, None)
    assert capsys.readouterr().out.startswith("usage:")


def test_gpu_script_parses_and_its_modules_exist():
    r = subprocess.run(["bash", "-n", str(GPU_SCRIPT)], check=False, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # Modules the script's Python runs (`pytest -m gpu` selects a marker, not a module).
    named = set(re.findall(r'"\$PYTHON" -m ([A-Za-z_][\w.]*)', GPU_SCRIPT.read_text()))
    assert {
        "benchmarks.bench_ttft",
        "benchmarks.microbench",
        "benchmarks.gpu.fit_config",
        "benchmarks.gpu.dummy_cache",
        "pytest",
    } <= named
    missing = [m for m in sorted(named) if importlib.util.find_spec(m) is None]
    assert not missing, f"run_gpu_bench.sh runs modules that do not exist: {missing}"


def test_documented_benchmark_commands_name_existing_modules():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = sorted(
        f"{doc.relative_to(ROOT)}: {m}"
        for doc in docs
        for m in set(re.findall(r"-m\s+(benchmarks(?:\.[a-z0-9_]+)+)", doc.read_text()))
        if not (ROOT / (m.replace(".", "/") + ".py")).is_file()
    )
    assert not missing, "documented commands of modules that do not exist:\n" + "\n".join(missing)
