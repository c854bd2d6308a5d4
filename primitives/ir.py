"""The plan IR, defined once: the five primitives, the attributes each node of a plan carries, and actor names.

A plan is a graph whose nodes are primitives (plain data, like ``torch.fx`` nodes); strategies create
them, engines and the simulator interpret them, plan files store them, and ``casync.plan.lint`` checks
them against :data:`NODE_ATTRS`.  Nothing here knows about graphs or Ray.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

#: The five primitives, in the order data meets them.
OPS: tuple[str, ...] = ("encode", "send", "recv", "merge", "decode")
COMPUTE_OPS: tuple[str, ...] = ("encode", "merge", "decode")


@dataclass(frozen=True)
class Attr:
    """One node attribute: what values it takes (``check``, described by ``what``) and what it means."""

    check: Callable[[Any], bool]
    what: str
    doc: str


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _nonneg(v: Any) -> bool:
    return _int(v) and v >= 0


def _name(v: Any) -> bool:
    return isinstance(v, str) and v != ""


INT = ("an int", _int)
NONNEG = ("an int >= 0", _nonneg)
POS = ("an int >= 1", lambda v: _int(v) and v >= 1)
NAME = ("a non-empty string", _name)
BOOL = ("true or false", lambda v: isinstance(v, bool))
OPT_NAME = ("null or a non-empty string", lambda v: v is None or _name(v))
OPT_NONNEG = ("null or an int >= 0", lambda v: v is None or _nonneg(v))


def _attr(kind: tuple[str, Callable[[Any], bool]], doc: str) -> Attr:
    return Attr(kind[1], kind[0], doc)


#: Attributes every node carries.
COMMON_ATTRS: dict[str, Attr] = {
    "op": _attr(NAME, "the primitive, one of OPS"),
    "actor": _attr(NAME, "where it runs: 'worker:<rank>' or 'server:<index>' (see Actor)"),
    "bucket": _attr(NAME, "the bucket (one tensor, or several fused) it works on"),
    "part": _attr(NONNEG, "the partition of that bucket"),
    "numel": _attr(NONNEG, "float32 elements of the partition"),
    "priority": _attr(INT, "the bucket's priority: lower runs first (backward order)"),
    "nbytes": _attr(NONNEG, "bytes it reads (compute ops) or moves (send/recv)"),
}
#: Attributes of each primitive, beyond the common ones.
NODE_ATTRS: dict[str, dict[str, Attr]] = {
    "encode": {
        "codec": _attr(NAME, "key of the codec in plan.codecs"),
        "local_input": _attr(BOOL, "encodes the actor's own gradient partition (no input edge)"),
        "ef": _attr(BOOL, "adds and keeps an error-feedback residual"),
        "ef_key": _attr(OPT_NAME, "the residual's key '<role>/<bucket>/<part>' (state_dict)"),
        "seed_key": _attr(NONNEG, "per-node part of the codec seed (with plan seed and step)"),
    },
    "decode": {
        "codec": _attr(NAME, "codec of the payload it decodes"),
        "output": _attr(BOOL, "its value is this worker's result for the partition"),
    },
    "merge": {
        "local_input": _attr(BOOL, "one input is the actor's own gradient partition"),
        "local_slot": _attr(OPT_NONNEG, "position of that local input in the sum"),
        "divisor": _attr(POS, "the sum is divided by it (N for a mean)"),
        "output": _attr(BOOL, "its value is this worker's result for the partition"),
    },
    "send": {
        "peer": _attr(NAME, "the receiving actor"),
        "codec": _attr(NAME, "codec of the payload"),
        "stage": _attr(NAME, "the strategy's phase, e.g. 'rs', 'ag', 'push', 'pull'"),
    },
    "recv": {
        "peer": _attr(NAME, "the sending actor"),
        "codec": _attr(NAME, "codec of the payload"),
        "stage": _attr(NAME, "the strategy's phase"),
    },
}
#: Attributes a node may carry.
OPTIONAL_ATTRS: dict[str, Attr] = {
    "round": _attr(NONNEG, "order of a shifted exchange: at round k each worker sends k places ahead"),
}
#: Plan format 1 called the bucket attribute ``tensor``; readers rename it.
RENAMED_ATTRS: dict[str, str] = {"tensor": "bucket"}

ROLES: tuple[str, ...] = ("worker", "server")


@dataclass(frozen=True, order=True)
class Actor:
    """An actor of a plan: a worker (one per data-parallel rank) or a dedicated PS server.

    Node attributes hold the name as a string (``str(Actor("worker", 3)) == "worker:3"``); ``Actor.parse``
    reads it back (cached), so no code splits names by hand.  Workers sort before servers.
    """

    role: str
    index: int

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"actor role must be one of {ROLES}, got {self.role!r}")
        if not _nonneg(self.index):
            raise ValueError(f"actor index must be an int >= 0, got {self.index!r}")

    def __str__(self) -> str:
        return f"{self.role}:{self.index}"

    @property
    def is_worker(self) -> bool:
        return self.role == "worker"

    @staticmethod
    def parse(name: str) -> "Actor":
        """``"worker:3"`` -> ``Actor("worker", 3)``; ValueError naming the name otherwise."""
        return _parse(name)

    @staticmethod
    def sort_key(name: str) -> tuple[bool, int]:
        """Workers first by rank, then servers by index."""
        actor = _parse(name)
        return (not actor.is_worker, actor.index)


@lru_cache(maxsize=4096)
def _parse(name: str) -> Actor:
    role, sep, index = name.partition(":") if isinstance(name, str) else ("", "", "")
    if not sep or role not in ROLES or not index.isdigit():
        raise ValueError(f"expected an actor name 'worker:<rank>' or 'server:<index>', got {name!r}")
    return Actor(role, int(index))


def worker(rank: int) -> str:
    """The name of worker ``rank``."""
    return f"worker:{rank}"


def server(index: int) -> str:
    """The name of dedicated PS server ``index``."""
    return f"server:{index}"


def rank_of(name: str) -> int:
    """The rank of a worker (or index of a server) named ``name``."""
    return _parse(name).index


def is_worker(name: str) -> bool:
    return _parse(name).is_worker
