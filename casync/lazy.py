"""Lazy package attributes (PEP 562): a package names what it offers, and each name is imported on first use.

Every Ray actor and gloo rank imports ``casync``; importing a package's whole API eagerly (the planner, the
simulator, networkx) would cost each of those processes a quarter of a second of CPU it mostly never uses.

    __getattr__, __dir__ = attach(__name__, {"SyncPlan": ".plan.syncplan", ...}, submodules=("sim",))
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Collection, Mapping


def attach(package: str, names: Mapping[str, str], submodules: Collection[str] = ()
           ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``names`` maps an attribute to the module (relative to
    ``package`` or absolute) that defines it under that name; ``submodules`` are imported when read as
    attributes.  A loaded value is stored on the package, so each name is looked up once, and it is the very
    object its module holds."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is not None:
            value = getattr(importlib.import_module(module, package), name)
        elif name in submodules:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names) | set(submodules))

    return __getattr__, __dir__
