"""``casync.primitives`` and ``casync.strategies`` in a source checkout used without installing it.

The repository keeps ``primitives/`` and ``strategies/`` at its top; installed (a wheel, or ``pip install -e``,
``setup.py``'s ``package_dir``) they are casync's subpackages.  Run straight from a checkout
(``PYTHONPATH=<checkout>``, as the emulated cluster and the lent GPU machines do), nothing maps them: this
finder does, for those two names only, when no installed mapping answers.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

MOVED = {"casync.primitives": "primitives", "casync.strategies": "strategies"}  # subpackage -> folder


class SourceLayout(importlib.abc.MetaPathFinder):
    """Finds the two moved subpackages in the checkout at ``root``."""

    def __init__(self, root: Path):
        self.root = root

    def find_spec(self, fullname: str, path: object = None, target: object = None):  # noqa: ANN201 (importlib's)
        folder = MOVED.get(fullname)
        if folder is None:
            return None
        where = self.root / folder
        return importlib.util.spec_from_file_location(fullname, where / "__init__.py",
                                                      submodule_search_locations=[str(where)])


def map_source_checkout() -> None:
    """Add the finder when ``casync.primitives`` has no installed home and this casync sits in a checkout."""
    root = Path(__file__).resolve().parents[1]
    if any(isinstance(f, SourceLayout) for f in sys.meta_path) or not (root / "primitives" / "__init__.py").exists():
        return
    if importlib.util.find_spec("casync.primitives") is None:
        sys.meta_path.append(SourceLayout(root))
