"""The layout stays what the README draws: small modules, no import cycles, dependencies pointing one way."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("casync", "strategies", "primitives")
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
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
    assert "casync.planner.choose" in imports_of("casync.plan.build") or "casync.planner" in imports_of("casync.plan.build")


def test_dependencies_point_one_way():
    """casync -> strategies -> primitives; primitives knows no graphs, strategies know no engines."""
    graph = import_graph()
    for module in MODULES:
        for target in graph.successors(module):
            if module.startswith("primitives"):
                assert target.startswith("primitives"), f"{module} imports {target}"
            if module.startswith("strategies"):
                assert not target.startswith("casync"), f"{module} imports {target}"


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


def test_primitives_need_only_numpy():
    for module in MODULES:
        if module.startswith("primitives"):
            for name in ("networkx", "ray", "torch", "casync", "strategies"):
                assert not _imports_named(module, name), f"{module} imports {name}"


def test_import_casync_and_building_a_fixed_plan_import_neither_ray_nor_the_planner():
    code = ("import sys, casync; casync.build_plan('resnet50', workers=4, strategy='ring', codec='onebit'); "
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('casync.planner') or m == 'torch'))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
