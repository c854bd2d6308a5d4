"""The layout stays what docs/design.md draws: small modules, no import cycles, dependencies pointing one way."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
#: each folder of the project and the package it installs as (primitives/ and strategies/ live at the top of the
#: repository but install under casync's namespace: setup.py's package_dir)
PACKAGES = {"casync": "casync", "strategies": "casync.strategies", "primitives": "casync.primitives"}
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package] + parts)] = path
    return out


MODULES = _modules()


def _type_checking_lines(tree: ast.AST) -> set[int]:
    """Line numbers inside ``if TYPE_CHECKING:`` blocks (imports for annotations only)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports_of(module: str) -> set[str]:
    """Project modules that ``module`` imports anywhere (module level or inside functions)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in MODULES and t != module)
    return found


def _packages_entered(importer: str, target: str) -> list[str]:
    """Packages whose ``__init__`` importing ``target`` runs first (those that are not the importer's own)."""
    parts = target.split(".")
    return [p for p in (".".join(parts[:i]) for i in range(1, len(parts)))
            if p in MODULES and not (importer == p or importer.startswith(p + "."))]


def import_graph() -> nx.DiGraph:
    """Module -> module it imports, plus the packages whose ``__init__`` that import runs on the way."""
    graph = nx.DiGraph()
    for module in MODULES:
        graph.add_node(module)
        for target in imports_of(module):
            graph.add_edge(module, target)
            for package in _packages_entered(module, target):
                graph.add_edge(module, package)
    return graph


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_over_500_lines(module):
    lines = MODULES[module].read_text().count("\n")
    assert lines <= MAX_LINES, f"{module} has {lines} lines; split it (one job per module)"


def test_no_import_cycles():
    cycles = list(nx.simple_cycles(import_graph()))
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c + [c[0]]) for c in cycles[:5])


def test_import_graph_sees_function_level_imports():
    """The checker itself: a lazy import inside a function is an edge (build_plan dispatches to the planner)."""
    assert "casync.planner.choose" in imports_of("casync.build") or "casync.planner" in imports_of("casync.build")


def test_dependencies_point_one_way():
    """casync -> casync.strategies -> casync.primitives; primitives knows no graphs, strategies know no engines."""
    graph = import_graph()
    for module in MODULES:
        for target in graph.successors(module):
            if module.startswith("casync.primitives"):
                assert target.startswith("casync.primitives"), f"{module} imports {target}"
            if module.startswith("casync.strategies"):
                assert target.startswith(("casync.strategies", "casync.primitives")), f"{module} imports {target}"


def test_the_plan_layer_imports_no_planner():
    """build_plan's facade (casync.build) dispatches to the planner; the plan layer below it never does."""
    graph = import_graph()
    for module in (m for m in MODULES if m.startswith("casync.plan.") or m == "casync.plan"):
        reached = nx.descendants(graph, module)
        assert not any(m.startswith("casync.planner") for m in reached), \
            f"{module} reaches the planner: {sorted(m for m in reached if m.startswith('casync.planner'))[:3]}"


def test_the_bare_folder_names_are_never_imported():
    """primitives/ and strategies/ install as casync.primitives and casync.strategies: a bare import anywhere
    (source, tests, benchmarks, examples) would make a second copy of the codec or strategy registry."""
    bare = re.compile(r"^\s*(from|import)\s+(primitives|strategies)\b", re.M)
    offenders = [str(path.relative_to(ROOT)) for folder in ("casync", "primitives", "strategies", "tests",
                                                              "benchmarks", "examples")
                 for path in (ROOT / folder).rglob("*.py") if bare.search(path.read_text())]
    assert not offenders, f"bare imports of primitives/strategies in {offenders}"
    run = subprocess.run([sys.executable, "-c", "import primitives"], capture_output=True, text=True, cwd=ROOT,
                         timeout=60)
    assert run.returncode != 0 and "installs as casync.primitives" in run.stderr, run.stderr


def _imports_named(module: str, name: str) -> bool:
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == name for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == name:
            return True
    return False


def test_ray_only_under_runtime_and_training():
    allowed = ("casync.runtime", "casync.training")
    offenders = [m for m in MODULES if _imports_named(m, "ray") and not m.startswith(allowed)]
    assert not offenders, f"modules outside {allowed} import Ray: {offenders}"


def test_a_checkout_on_pythonpath_maps_the_moved_subpackages_itself():
    """Without an installed mapping (the editable install's finder removed, as on a machine that runs the checkout
    from PYTHONPATH), casync.primitives and casync.strategies are still the checkout's folders, one copy each."""
    code = ("import sys; "
            "sys.meta_path[:] = [f for f in sys.meta_path if 'Editable' not in getattr(f, '__name__', '')]; "
            "import casync, casync.primitives.codecs.sign as s, casync.strategies as st; "
            "print(s.__file__); print(st.__file__); print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('primitives', 'strategies')))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    sign, strategies, bare = run.stdout.split("\n")[:3]
    assert Path(sign) == ROOT / "primitives" / "codecs" / "sign.py" and Path(strategies) == ROOT / "strategies" / \
        "__init__.py" and bare == "[]"


def test_primitives_need_only_numpy():
    for module in MODULES:
        if module.startswith("casync.primitives"):
            for name in ("networkx", "ray", "torch"):
                assert not _imports_named(module, name), f"{module} imports {name}"


def test_import_casync_and_building_a_fixed_plan_import_neither_ray_nor_the_planner():
    code = ("import sys, casync; casync.build_plan('resnet50', workers=4, strategy='ring', codec='onebit'); "
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('casync.planner') or m == 'torch'))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
