"""NaN and Inf in gradients: what engines do about them, decided in one place (:func:`void_step`).

``build_plan(..., nonfinite=mode)`` chooses what the engines do when a worker's gradient is not finite:

* ``"raise"`` (default): :class:`~casync.errors.NonFiniteGradientError` naming each worker and tensor with
  its NaN/Inf counts.  Nothing is synchronized: step and error-feedback state stay as they were.
* ``"skip"``: the step is skipped on every worker alike: ``sync`` returns zeros with ``out.skipped`` True
  (and ``out.nonfinite`` the reports), error-feedback residuals are not updated, the step counter advances.
* ``"propagate"``: the values flow to every worker's result, bit-identical on every worker, at exactly the
  positions where they occurred (as an uncompressed all-reduce would put them).

Detection is one pass per worker gradient (:func:`casync.primitives.finite.all_finite`, about half the time of a
onebit encode); :func:`scan_worker` names what it finds, on the driver before a step, and an executor's
:class:`GradientScan` partition by partition inside the ops, for gradients the driver never held (or, where
an error-feedback encode whose payload tells whether its input was finite is a partition's only reader, after
that encode, and only when the payload says it was not: :func:`certifiers`).  Inside a
sync, payloads carry NaN/Inf on a side channel (``casync.primitives.finite``), so every codec delivers them exactly;
merges propagate them as float arithmetic does; error-feedback residuals stay finite (zero where the value
travelled exactly).
"""
from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any, Collection, Mapping, Sequence

import numpy as np

from casync.primitives.finite import all_finite, nonfinite_positions

from ..errors import NonFiniteGradientError


@dataclass(frozen=True)
class NonFiniteReport:
    """One worker's tensor that held NaN and/or Inf, with how many of each."""

    worker: int
    tensor: str
    nan: int
    inf: int

    def __str__(self) -> str:
        return f"worker {self.worker}, tensor {self.tensor!r}: {self.nan} NaN, {self.inf} Inf"


@dataclass(frozen=True)
class BucketLayout:
    """Where tensors and partitions sit in a bucket's flat buffer: enough to name what a scan finds."""

    name: str
    tensors: tuple[str, ...]
    tensor_stops: tuple[int, ...]  # end offset of each member in the flat buffer
    part_stops: tuple[int, ...]  # end offset of each partition


def layouts(plan: Any) -> list[BucketLayout]:
    """The plan's buckets as :class:`BucketLayout` (plain data, cheap to ship to actors)."""
    return [BucketLayout(b.name, tuple(m.spec.name for m in b.members), tuple(m.stop for m in b.members),
                         tuple(stop for _, stop in b.partitions)) for b in plan.buckets]


def scan_worker(bucket_layouts: list[BucketLayout], worker: int, buffers: Mapping[str, np.ndarray]
                ) -> tuple[list[NonFiniteReport], set[tuple[str, int]]]:
    """Check one worker's flat bucket buffers: reports per offending tensor, and the (bucket, partition)
    pairs that hold non-finite values (the encodes that must carry them on the side)."""
    reports: list[NonFiniteReport] = []
    parts: set[tuple[str, int]] = set()
    for layout in bucket_layouts:
        flat = buffers.get(layout.name)
        if flat is None or all_finite(flat):
            continue
        where = nonfinite_positions(flat)
        reports += name_nonfinite(layout, worker, where, np.isnan(flat[where]))
        parts.update((layout.name, int(p)) for p in np.unique(np.searchsorted(layout.part_stops, where, side="right")))
    return reports, parts


def name_nonfinite(layout: BucketLayout, worker: int, where: np.ndarray, nan: np.ndarray) -> list[NonFiniteReport]:
    """Reports per tensor of ``layout`` for the non-finite values at bucket offsets ``where`` (ascending),
    ``nan`` telling which of them are NaN (the rest are Inf)."""
    member = np.searchsorted(layout.tensor_stops, where, side="right")
    reports = []
    for index in np.unique(member):
        mask = member == index
        n_nan = int(np.count_nonzero(nan[mask]))
        reports.append(NonFiniteReport(worker, layout.tensors[index], n_nan, int(np.count_nonzero(mask)) - n_nan))
    return reports


@dataclass(frozen=True)
class GradientScan:
    """What a worker's executor needs to scan its gradient partition by partition, inside the first op that
    reads each one, instead of in one pass before the step starts: the scan then overlaps the step's
    communication and is spread over the compute threads, and the first encode starts at once."""

    worker: int
    layouts: Mapping[str, BucketLayout]

    @classmethod
    def of(cls, worker: int, bucket_layouts: Any) -> "GradientScan":
        return cls(worker, {layout.name: layout for layout in bucket_layouts})

    @staticmethod
    def check(values: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """None when ``values`` (a partition) are finite; else the positions of NaN/Inf in it and which are NaN."""
        if all_finite(values):
            return None
        where = nonfinite_positions(values)
        return where, np.isnan(values[where])

    def reports(self, found: Mapping[str, list[tuple[int, tuple[np.ndarray, np.ndarray]]]]) -> list[NonFiniteReport]:
        """Reports per tensor from what :meth:`check` found, by bucket: (the partition's start, its finding)
        pairs; the same reports as :func:`scan_worker` of the whole gradient."""
        reports: list[NonFiniteReport] = []
        for name, layout in self.layouts.items():
            pieces = sorted(found.get(name, ()), key=lambda piece: piece[0])
            if pieces:
                where = np.concatenate([start + w for start, (w, _) in pieces])
                reports += name_nonfinite(layout, self.worker, where, np.concatenate([nan for _, (_, nan) in pieces]))
        return reports


class PartitionScans:
    """One step's scans of a worker's gradient partitions (for :class:`GradientScan`), each done once, by the
    first op that reads the partition, before it uses it: a partition holding NaN/Inf joins ``flagged`` (its
    encodes then carry them on the side), and an op of another compute thread that reads the same partition
    meanwhile waits for that scan instead of scanning again."""

    def __init__(self, scan: GradientScan | None, flagged: set[tuple[str, int]]):
        self.scan, self.flagged = scan, flagged
        self._cond = threading.Condition()
        self._unscanned: set[tuple[str, int]] = set()  # provided, no op has read them yet
        self._scanning: set[tuple[str, int]] = set()  # one op is scanning them now
        self._found: dict[str, list[tuple[int, Any]]] = {}  # bucket -> (partition start, GradientScan.check's)
        self._claims: dict[int, tuple] = {}  # certifying encode -> (key, start, values) of the partition it settles

    def expect(self, bucket: str, parts: int) -> None:
        """The ``parts`` partitions of ``bucket`` came unscanned (nothing to do for a bucket the scan lacks)."""
        if self.scan is not None and bucket in self.scan.layouts:
            with self._cond:
                self._unscanned.update((bucket, p) for p in range(parts))

    def before_read(self, bucket: str, part: int, start: int, values: np.ndarray) -> None:
        """An op is about to read partition ``part`` of ``bucket`` (``values``, at offset ``start``)."""
        key = (bucket, part)
        if key not in self._unscanned and not self._scanning:  # without the lock: a key is in one set or the
            return  # other while it is not scanned yet (added to the second before it leaves the first)
        with self._cond:
            if not self._take(key):
                while key in self._scanning:
                    self._cond.wait(1.0)
                return
        self._scan(key, start, values)

    def claim(self, bucket: str, part: int, start: int, values: np.ndarray, certifier: int) -> bool:
        """Leave partition ``part`` of ``bucket``, which its only reader is about to read, unscanned for now:
        the error-feedback encode ``certifier`` (an op index) will say whether it was finite (:meth:`settle`).
        False, and nothing claimed, unless the partition is still to be scanned."""
        key = (bucket, part)
        with self._cond:
            if not self._take(key):
                return False
            self._claims[certifier] = (key, start, values)
        return True

    def _take(self, key: tuple[str, int]) -> bool:
        """Move ``key`` from unscanned to being scanned, if it is still unscanned (call with the lock held): it
        enters ``_scanning`` before it leaves ``_unscanned``, so an unlocked check never sees it in neither."""
        if key not in self._unscanned:
            return False
        self._scanning.add(key)
        self._unscanned.discard(key)
        return True

    def take_claim(self, certifier: int) -> tuple | None:
        """The claim encode ``certifier`` settles, if it has one."""
        return self._claims.pop(certifier, None) if self._claims else None

    def settle(self, claim: tuple, certified: bool) -> bool:
        """End a claim once its encode ran: the partition is scanned unless the payload ``certified`` it finite.
        True when it holds NaN/Inf (then flagged and reported as :meth:`before_read`'s scan would)."""
        key, start, values = claim
        return self._scan(key, start, values, skip=certified)

    def _scan(self, key: tuple[str, int], start: int, values: np.ndarray, skip: bool = False) -> bool:
        found = None
        try:
            found = None if skip else self.scan.check(values)
        finally:
            with self._cond:
                if found is not None:
                    self._found.setdefault(key[0], []).append((start, found))
                    self.flagged.add(key)
                self._scanning.discard(key)
                self._cond.notify_all()
        return found is not None

    def reports(self) -> list[NonFiniteReport]:
        """What the step's scans found, one report per tensor (as :func:`scan_worker` of the whole gradient)."""
        return self.scan.reports(self._found) if self._found else []


def certifiers(ops: Sequence[Any], pending: Collection[int]) -> dict[int, int]:
    """For each op that is the only reader of one of its actor's gradient partitions, the error-feedback encode
    that reads it (the op itself, or the encode a merge left pending is handed to: ``pending``), by op index.
    Where that encode's codec ``certifies_finite``, its payload says whether the partition held NaN/Inf, so the
    partition need not be scanned first (:meth:`PartitionScans.claim`): the scan's read of the partition is
    saved, and made only when the payload says it was not finite."""
    readers = Counter((op.attrs["bucket"], op.attrs["part"]) for op in ops if op.attrs.get("local_input"))
    found = {}
    for index, op in enumerate(ops):
        a = op.attrs
        if not a.get("local_input") or readers[a["bucket"], a["part"]] != 1:
            continue
        if a["op"] == "encode" and a.get("ef"):
            found[index] = index
        elif a["op"] == "merge" and index in pending:
            found[index] = op.consumers[0]
    return found


class SyncOutput(list):
    """What ``sync`` returns: one mapping per worker (a list), plus what happened to non-finite values.

    ``skipped`` is True when the plan's ``nonfinite="skip"`` voided this step (every result is zero);
    ``nonfinite`` lists the :class:`NonFiniteReport` of the step (empty when all gradients were finite).
    """

    def __init__(self, results: Any = (), skipped: bool = False, nonfinite: list[NonFiniteReport] | None = None):
        super().__init__(results)
        self.skipped = skipped
        self.nonfinite = list(nonfinite or [])




def voids_step(mode: str, reports: list[NonFiniteReport]) -> bool:
    """Whether a step with these reports is voided (not applied) under ``mode``: raise and skip void it."""
    return bool(reports) and mode != "propagate"


def raise_if_raising(mode: str, reports: list[Any], step: int | None = None) -> None:
    """Under ``"raise"``, NaN/Inf reports become a :class:`~casync.errors.NonFiniteGradientError`."""
    if reports and mode == "raise":
        raise NonFiniteGradientError(reports, step)


def void_step(plan: Any, reports: list[NonFiniteReport], step: int | None = None) -> SyncOutput:
    """The policy for a step whose gradients held NaN/Inf, the same in every engine: under ``"raise"`` a
    :class:`~casync.errors.NonFiniteGradientError` (the caller leaves step and state untouched); under
    ``"skip"`` every worker gets zeros with ``skipped=True`` (the caller counts the step, keeps residuals)."""
    raise_if_raising(plan.nonfinite, reports, step)
    zeros = [{b.name: np.zeros(b.numel, np.float32) for b in plan.buckets} for _ in range(plan.workers)]
    return SyncOutput(zeros, skipped=True, nonfinite=reports)
