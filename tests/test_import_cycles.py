"""No import cycles among the project's modules at run time, and the layering rules that hold.

The graph is read from the source with `ast` (nothing is imported). An edge A → B is an
`import` or `from ... import` statement in module A that names project module B, wherever it
stands: at module level, inside a function or method, under try/except. An import inside a
function runs when the function is first called and can close a cycle then, so it counts.

- Not counted: imports under `if TYPE_CHECKING:` (never run; an `else:` branch is counted), and
  module names given to `importlib.import_module` as data (the lazy command tables).
- `from pkg import name` is an edge to `pkg.name` when that is a module of the project, else to
  `pkg`. Relative imports resolve against the importer's package.
- Importing `a.b.c` also runs the `__init__.py` of `a` and `a.b`: those are edges too, except
  to the importer's own enclosing packages, which Python has started before the importer.
- Imports of modules outside the project (stdlib, third-party) are not edges.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from tests.project_packages import ALL_PACKAGES, PRODUCT_PACKAGES

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ALL_PACKAGES

# Layering: (importer, forbidden, why), one line per rule. A module under `importer` (that module
# or package, or anything inside it) must not itself import a module under `forbidden`: direct
# imports only, by the rules above (the parent packages an import runs on the way aside). Not
# transitive: router.server reaches sglang_ext.engine.model_store today through routing.estimates
# and planning.model_memory, which size models from their config.json.
FORBIDDEN_IMPORTS: list[tuple[str, str, str]] = [
    (
        "router",
        "sglang_ext.engine",
        "the router talks HTTP to workers; it never imports the engine",
    ),
    ("router.config", "routing", "the config schema is below routing; the loader expands pools"),
    ("planning", "launch", "planning sits below launch: launch executes plans"),
    *(
        (package, "benchmarks", "benchmarks use the product; the product never imports them")
        for package in PRODUCT_PACKAGES
    ),
]


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    where: str  # file:line of the import statement
    implicit: bool = False  # a package whose __init__.py the import runs on the way


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name → its file, for every .py under each package that exists."""
    out: dict[str, Path] = {}
    for pkg in packages:
        base = root / pkg
        if not base.is_dir():
            continue
        for f in sorted(base.rglob("*.py")):
            parts = f.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _run_time_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except those under `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return found


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _targets(node: ast.Import | ast.ImportFrom, module: str, path: Path, known: set[str]):
    """The project modules an import statement names (before adding their parent packages)."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    base = node.module or ""
    if node.level:
        pkg_parts = _package_of(module, path).split(".")
        anchor = ".".join(pkg_parts[: len(pkg_parts) - (node.level - 1)])
        base = f"{anchor}.{base}" if base else anchor
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        yield sub if alias.name != "*" and sub in known else base


def import_graph(root: Path, files: dict[str, Path]) -> list[Edge]:
    known = set(files)
    edges: list[Edge] = []
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        started = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 2)}
        if path.name != "__init__.py":
            started.discard(module)
        for node in _run_time_imports(tree):
            where = f"{path.relative_to(root).as_posix()}:{node.lineno}"
            for target in _targets(node, module, path, known):
                parts = target.split(".")
                names = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
                for name in sorted(names & known):
                    if name != module and name not in started:
                        edges.append(Edge(module, name, where, implicit=name != target))
    return edges


def strongly_connected(nodes: set[str], edges: list[Edge]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components of more than one module, sorted."""
    succ: dict[str, list[str]] = {n: [] for n in nodes}
    for e in edges:
        succ[e.importer].append(e.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(succ[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(succ[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def import_cycles(root: Path, packages: tuple[str, ...]) -> list[str]:
    """One line per cycle: its modules, then each import that closes it, with file:line."""
    files = module_files(root, packages)
    edges = import_graph(root, files)
    lines = []
    for comp in strongly_connected(set(files), edges):
        inside = sorted(
            {
                f"{e.importer} -> {e.imported} ({e.where})"
                for e in edges
                if e.importer in comp and e.imported in comp
            }
        )
        lines.append(f"{' <-> '.join(comp)}: " + "; ".join(inside))
    return lines


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layering_violations(root: Path, packages: tuple[str, ...], rules) -> list[str]:
    edges = import_graph(root, module_files(root, packages))
    return sorted(
        f"{e.importer} imports {e.imported} ({e.where}): {why}"
        for importer, forbidden, why in rules
        for e in edges
        if not e.implicit and _under(e.importer, importer) and _under(e.imported, forbidden)
    )


# --- the project ---------------------------------------------------------------------------------
def test_no_import_cycles():
    cycles = import_cycles(ROOT, PACKAGES)
    assert not cycles, "import cycles at run time:\n" + "\n".join(cycles)


def test_layering_rules_hold():
    broken = layering_violations(ROOT, PACKAGES, FORBIDDEN_IMPORTS)
    assert not broken, "layering rules broken:\n" + "\n".join(broken)


def test_the_graph_covers_the_project():
    files = module_files(ROOT, PACKAGES)
    edges = import_graph(ROOT, files)
    # Spot checks that the parser sees real edges, so an empty graph cannot pass as acyclic.
    pairs = {(e.importer, e.imported) for e in edges}
    assert ("router.config_loader", "router.config") in pairs
    assert len(files) > 100 and len(edges) > 300


# --- the checker itself, on a synthetic tree ---------------------------------------------------
def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        f = tmp_path / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return tmp_path


def test_finder_reports_a_cycle_through_a_function_level_import(tmp_path):
    root = _tree(
        tmp_path,
        {
            "pa/__init__.py": "",
            "pa/a.py": "from pa import b\n",
            "pa/b.py": "def f():\n    from . import c\n",
            "pa/c.py": "import pa.a as a\n",
            "pa/d.py": "from pa.a import thing\n",  # into the cycle, not part of it
        },
    )
    cycles = import_cycles(root, ("pa",))
    assert len(cycles) == 1
    assert cycles[0].startswith("pa.a <-> pa.b <-> pa.c: ")
    assert "pa.b -> pa.c (pa/b.py:2)" in cycles[0]
    assert "pa.d" not in cycles[0]


def test_finder_ignores_type_checking_imports(tmp_path):
    root = _tree(
        tmp_path,
        {
            "pa/__init__.py": "",
            "pa/a.py": "from pa.b import B\n",
            "pa/b.py": (
                "import typing\nfrom typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from pa.a import A\n"
                "if typing.TYPE_CHECKING:\n    import pa.a\n"
            ),
        },
    )
    assert import_cycles(root, ("pa",)) == []
    # ... but the else branch of the same `if` runs.
    (root / "pa/b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\nelse:\n    import pa.a\n"
    )
    assert import_cycles(root, ("pa",)) == [
        "pa.a <-> pa.b: pa.a -> pa.b (pa/a.py:1); pa.b -> pa.a (pa/b.py:5)"
    ]


def test_finder_counts_a_package_init_but_not_the_importers_own(tmp_path):
    files = {
        "pa/__init__.py": "from pa.sub.x import X\n",
        "pa/sub/__init__.py": "from .x import X\n",
        "pa/sub/x.py": "from pa.sub import y\n",  # its own packages: no cycle
        "pa/sub/y.py": "",
        "pb/__init__.py": "",
        "pb/m.py": "import pa.sub.y\n",  # runs pa/__init__ and pa/sub/__init__
    }
    root = _tree(tmp_path, files)
    assert import_cycles(root, ("pa", "pb")) == []
    edges = {(e.importer, e.imported) for e in import_graph(root, module_files(root, ("pa", "pb")))}
    assert {("pb.m", "pa"), ("pb.m", "pa.sub"), ("pb.m", "pa.sub.y")} <= edges
    (root / "pa/sub/y.py").write_text("from pb import m\n")
    assert import_cycles(root, ("pa", "pb")) != []


def test_layering_rule_names_the_import(tmp_path):
    root = _tree(
        tmp_path,
        {
            "pa/__init__.py": "",
            "pa/low.py": "def f():\n    from pb.high import g\n",
            "pb/__init__.py": "",
            "pb/high.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pa.low\n",
        },
    )
    rules = [("pa.low", "pb", "low is below pb")]
    assert layering_violations(root, ("pa", "pb"), rules) == [
        "pa.low imports pb.high (pa/low.py:2): low is below pb"
    ]
    assert layering_violations(root, ("pa", "pb"), [("pb", "pa", "the other way")]) == []
