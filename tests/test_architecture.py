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
    return found | _lazy_imports_of(module, tree, package)


def _lazy_imports_of(module: str, tree: ast.AST, package: str) -> set[str]:
    """Modules a lazy package (``casync.lazy.attach``) names as strings: its ``__getattr__`` imports them on first
    use, an edge like a function-level import.  Any string in the package's ``__init__`` that names a module
    (``".sim.costmodel"``, ``"casync.strategies"``) or a submodule (``"sim"``) counts."""
    if MODULES[module].name != "__init__.py" or "attach" not in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}:
        return set()
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            target = package + text if text.startswith(".") else text if text in MODULES else f"{package}.{text}"
            if target in MODULES and target != module:
                found.add(target)
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


#: what a Ray actor or a gloo rank process imports first (``RemoteExecutorActor``, ``RemoteSyncActor``, the Trainer's
#: workers, the baselines' and the time-to-accuracy mode's rank entries)
PROCESS_ENTRIES = ("casync.runtime.executor_actor", "casync.runtime.ray_actor", "casync.training.worker",
                   "casync.bench.baselines", "casync.bench.tta.rank")
#: what none of them needs to start: the planner, plan building and the simulator, and what they bring
NOT_AT_START = ("networkx", "matplotlib", "sklearn", "casync.planner", "casync.build", "casync.plan.assemble",
                "casync.strategies", "casync.sim.simulator", "casync.drawing")


def test_actor_and_rank_processes_start_without_the_planner_or_networkx():
    """Hundreds of actors and ranks start per suite run: each imports only what it runs (issue #42)."""
    code = ("import importlib, sys\n"
            f"for entry in {PROCESS_ENTRIES!r}:\n"
            "    importlib.import_module(entry)\n"
            f"    print(entry, sorted(m for m in {NOT_AT_START!r} if m in sys.modules))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(PROCESS_ENTRIES)
    assert all(line.endswith(" []") for line in lines), "imported at start (entries in import order):\n" + run.stdout


def test_import_casync_imports_none_of_its_dependencies_and_lookups_find_every_builtin():
    """``import casync`` loads no torch, Ray, networkx or NumPy; the first lookup imports (and so registers) the
    built-in codecs and strategies."""
    code = ("import sys, casync\n"
            "print(sorted(m for m in ('torch', 'ray', 'networkx', 'numpy', 'matplotlib') if m in sys.modules))\n"
            "print(casync.available_strategies(), casync.get_codec('topk:ratio=0.1').name)\n"
            "from casync.primitives.codecs import available_codecs\n"
            "print(len(available_codecs()))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    loaded, lookups, codecs = run.stdout.splitlines()
    assert loaded == "[]"
    assert lookups == "['ring', 'ps', 'allgather'] topk"
    assert int(codecs) >= 8


def test_every_public_name_of_a_lazy_package_is_the_object_its_module_defines():
    """``casync.X`` (and ``casync.plan.X``, ...) is loaded on first use (``casync.lazy``): the same object as
    ``from <its module> import X``, listed by ``dir`` and ``__all__``, and ``from casync import *`` binds them."""
    import importlib

    import casync

    for package in ("casync", "casync.plan", "casync.sim", "casync.engines", "casync.planner"):
        module = importlib.import_module(package)
        assert set(module.__all__) <= set(dir(module)), package
        for name in module.__all__:
            value = getattr(module, name)
            defined = getattr(value, "__module__", None)
            if defined and defined.startswith("casync.") and isinstance(value, type | type(imports_of)):
                assert getattr(importlib.import_module(defined), value.__name__) is value, f"{package}.{name}"
    assert casync.SyncPlan is importlib.import_module("casync.plan.syncplan").SyncPlan
    assert casync.get_codec is importlib.import_module("casync.primitives.codecs").get_codec
    assert casync.sim.simulate is casync.simulate  # a subpackage a bare import once loaded is still an attribute
    names: dict = {}
    exec("from casync import *", names)
    assert {n for n in names if not n.startswith("__")} == set(casync.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        casync.nope  # noqa: B018
