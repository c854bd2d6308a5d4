"""The CPU a direct data plane's threads spend beyond the ops, fitted from the actors' process CPU.

Each actor's process burns CPU besides its compute ops: its sender threads' copies, socket reads and writes,
thread wake-ups, Ray's own threads.  :func:`fit_thread_cpu` splits it into a cost per sync, per message and per byte
by what the message goes through (``casync.sim.costmodel.copy_kind``), which the simulator charges on the node's
cores (``casync.sim.costmodel.RuntimeCosts``: ``sync_cpu_s``, ``message_cpu_s``, ``copy_cpu``).
"""
from __future__ import annotations

import itertools
import math
from typing import Any, Mapping, Sequence

import numpy as np

from casync.primitives.ir import COMPUTE_OPS

from ..plan.syncplan import SyncPlan
from ..sim.costmodel import ClusterModel, copy_kind


def fit_thread_cpu(runs: Sequence[tuple[SyncPlan, Sequence[Sequence[dict[str, Any]]]]],
                   process_cpu: Sequence[Mapping[str, float]], op_gap_s: float = 0.0,
                   cluster: ClusterModel | None = None, transport: str = "direct"
                   ) -> tuple[float, float, dict[str, float]]:
    """``(per_sync_s, per_message_s, copy_cpu)``: the CPU the actors' processes spend beyond their compute ops, per
    actor and sync, per message sent, and per byte sent by what it goes through (``copy_cpu``: ``{"shm": s/byte,
    "gloo": ...}``, :func:`casync.sim.costmodel.copy_kind` of ``transport`` within a node or between the nodes of
    ``cluster``; default: all on one node).

    One sample per run and actor: *other* = process CPU per sync − its compute ops' own CPU (their records'
    ``cpu``) − the executor's ``op_gap_s`` per compute op, against 1, the messages and the bytes of each kind it
    sends per sync; the costs by non-negative least squares.  They are told apart only where the runs differ in
    messages per sync and in bytes per message (the default calibration's strategies and codecs do); where they
    do not, the fit still reproduces the runs, split among them arbitrarily.
    """
    if len(process_cpu) != len(runs):
        raise ValueError(f"process_cpu has {len(process_cpu)} entries for {len(runs)} runs")
    rows, other = [], []
    kinds: list[str] = []
    samples: list[tuple[float, float, dict[str, float]]] = []
    for (plan, steps), cpu in zip(runs, process_cpu):
        for actor, seconds in cpu.items() if steps else ():
            ops = [r for rows_ in steps for r in rows_ if r["actor"] == actor]
            compute = [r for r in ops if r["op"] in COMPUTE_OPS]
            sends = [r for r in ops if r["op"] == "send"]
            if not sends:
                continue
            own = sum(r.get("cpu") or 0.0 for r in compute) + op_gap_s * len(compute)
            by_kind: dict[str, float] = {}
            for r in sends:
                kind = copy_kind(transport, _same_node(plan, r, cluster))
                by_kind[kind] = by_kind.get(kind, 0.0) + r["nbytes"] / len(steps)
                if kind not in kinds:
                    kinds.append(kind)
            samples.append((len(sends) / len(steps), max(0.0, seconds - own / len(steps)), by_kind))
    if not samples:
        raise ValueError("no messages in the measured runs: cannot fit the data plane's CPU per message")
    for messages, spent, by_kind in samples:
        rows.append((1.0, messages, *(by_kind.get(k, 0.0) for k in kinds)))
        other.append(spent)
    sync, per_message, *copies = _nonnegative_lstsq(np.array(rows, float), np.array(other, float))
    return sync, per_message, dict(zip(kinds, copies))


def _same_node(plan: SyncPlan | None, row: dict[str, Any], cluster: ClusterModel | None) -> bool:
    """Whether a send record's message stays on its node (its peer from the record, else the plan's node)."""
    if cluster is None:
        return True
    peer = row.get("peer")
    if peer is None and plan is not None and row.get("node") in plan.graph:
        peer = plan.graph.nodes[row["node"]].get("peer")
    return peer is None or cluster.node_of(row["actor"]) == cluster.node_of(peer)


def _nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> list[float]:
    """Least squares with every coefficient >= 0: the best unconstrained fit over each subset of columns
    (a handful of columns: exact, no solver needed)."""
    best: tuple[float, list[float]] = (math.inf, [0.0] * x.shape[1])
    for used in itertools.product((False, True), repeat=x.shape[1]):
        cols = [i for i, u in enumerate(used) if u]
        coef = [0.0] * x.shape[1]
        if cols:
            sol = np.linalg.lstsq(x[:, cols], y, rcond=None)[0]
            if np.any(sol < 0):
                continue
            for i, v in zip(cols, sol):
                coef[i] = float(v)
        err = float(np.sum((y - x @ np.array(coef)) ** 2))
        if err < best[0] - 1e-18 * max(1.0, float(np.dot(y, y))):
            best = (err, coef)
    return best[1]



__all__ = ["fit_thread_cpu"]
