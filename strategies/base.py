"""The ``Strategy`` interface: everything casync knows about one way to synchronize a bucket, in one object.

A strategy turns one :class:`Unit` (a bucket, already partitioned) into encode / send / recv / merge /
decode nodes (:meth:`Strategy.expand`), and tells the rest of casync what that costs: exact op counts
(plan-size limits, the planner's simulation budget), its default and candidate partition counts, an
optional symmetric template for simulating huge clusters, and an optional analytical estimate for the
planner.  Register a new one with :func:`casync.strategies.register_strategy`; the planner, ``build_plan``, the
bench grid, the CLI and the docs table read the registry.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from casync.primitives.codecs import Codec

if TYPE_CHECKING:
    from .builder import GraphBuilder


@dataclass(frozen=True)
class Unit:
    """What a strategy expands: one bucket with its partitions and sync options."""

    bucket: str
    partitions: tuple[tuple[int, int], ...]
    workers: int
    codec: Codec
    error_feedback: bool  # resolved for this codec (casync.primitives.feedback.resolve)
    divisor: int  # N for mean, 1 for sum
    priority: int
    servers: int | None = None  # PS: dedicated server actors (None = co-located on workers)
    two_way: bool = True  # PS: servers compress the aggregate they send back

    @property
    def ef(self) -> bool:
        return self.error_feedback and not self.codec.lossless


class Strategy(ABC):
    """One sync strategy.  Subclasses set :attr:`name` and implement :meth:`expand` and :meth:`op_count`.

    Every worker must end with exactly one ``output`` node per partition, and results must be bit-identical
    on every worker (decode the same bytes, merge in the same order): the conformance tests check both.
    """

    #: registry key, the ``strategy=`` value of ``build_plan``
    name: ClassVar[str] = ""
    #: one line for docs and ``--help``
    summary: ClassVar[str] = ""
    #: ops per partition of a bucket for N workers (the README table): encode, decode, merge, send
    costs: ClassVar[dict[str, str]] = {}
    #: whether ``servers=S`` (dedicated server actors) applies
    takes_servers: ClassVar[bool] = False
    #: the planner considers it for ``strategy="auto"``
    in_auto: ClassVar[bool] = True

    # -- the graph -----------------------------------------------------------------------------------------
    @abstractmethod
    def expand(self, g: GraphBuilder, unit: Unit) -> None:
        """Add the nodes of ``unit``'s sync to ``g``."""

    def expand_compact(self, g: GraphBuilder, unit: Unit) -> None:
        """A symmetric template: one representative worker's ops (see ``casync.strategies.ring``); simulation only."""
        raise ValueError(f"strategy {self.name!r} has no compact template; simulate the full plan "
                         "(assemble_plan(..., compact=False))")

    def has_compact(self, unit_servers: int | None = None) -> bool:
        """Whether :meth:`expand_compact` is exact for this configuration."""
        return False

    # -- sizes ---------------------------------------------------------------------------------------------
    @abstractmethod
    def op_count(self, workers: int, parts: int, servers: int | None = None) -> int:
        """Exactly how many ops a bucket of ``parts`` partitions expands to (before building it)."""

    def compact_op_count(self, workers: int, parts: int) -> int:
        """How many ops the compact template of such a bucket has (at most)."""
        return self.op_count(workers, parts)

    def compact_partitions(self, workers: int, parts: int, requested: int | None) -> int:
        """The partition count a compact template needs (e.g. whole rotations of the ring)."""
        return parts

    def default_partitions(self, workers: int, servers: int | None = None) -> int:
        """Partitions when the user gives none (before the 64 KiB-per-part floor)."""
        return 1

    def partition_candidates(self, workers: int) -> tuple[int, ...]:
        """What ``partitions="auto"`` tries besides the default (before the 64 KiB-per-part cap)."""
        return (1, 2, 4)

    # -- the planner's estimate ------------------------------------------------------------------------------
    def estimate(self, est: Any, acc: Any, n: int, parts: int, codec: Codec) -> tuple[float, int] | None:
        """Analytical isolated cost of a bucket of ``parts`` partitions of ``n`` elements, for the planner.

        ``est`` offers the cost model (``N``, ``o`` per-task cost, ``enc``, ``dec``, ``merge``, ``links``,
        ``slots``, ``two_way``); record each resource's use with ``acc.use(kind, workers, start, end, busy)``
        (kind 0 compute, 1 egress, 2 ingress) and the messages each worker sends with
        ``acc.sent(est, workers, count, nbytes)`` (their threads' CPU, where a profile prices it).  Returns
        (makespan, wire bytes), or None to let the planner simulate the bucket alone instead (exact, slower):
        the default.
        """
        return None

    def coupling(self, workers: int, parts: int) -> float:
        """How much a worker's egress and ingress wait for each other in this exchange (0: not at all)."""
        return 0.0

    # -- views ---------------------------------------------------------------------------------------------
    def variants(self) -> dict[str, dict[str, Any]]:
        """Labelled ``build_plan`` arguments a strategy comparison runs (PS: one-way and two-way)."""
        return {self.name: {"strategy": self.name}}

    def label(self, bucket: Any) -> str:
        """How ``plan.summary()`` names this strategy for a bucket."""
        return self.name

    def __repr__(self) -> str:
        return f"<strategy {self.name!r}>"
