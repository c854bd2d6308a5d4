"""The measured timeline an engine keeps: per-op rows of its recent steps, bounded in memory."""
from __future__ import annotations

from typing import Any

TIMELINE_STEPS_KEPT = 16  # timeline() covers the most recent iterations only


def op_rows(step: int, records: dict[str, list[tuple]], send_of: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Per-actor op records ``(op, bucket, part, start, end, nbytes, node[, cpu[, queued]])`` as rows sorted by
    start (``cpu``: the executing thread's CPU seconds in the op; ``queued``: its seconds runnable but waiting for
    a core; None where a record has none, e.g. a Trainer's forward/backward/update rows, or the system does not
    say).

    ``send_of``: recv node -> its send node; a recv row then spans from the moment its payload was sent to
    the moment it was used."""
    send_end: dict[str, float] = {}
    rows = []
    for actor, actor_records in records.items():
        for op, bucket, part, start, end, nbytes, node, *thread in actor_records:
            rows.append(dict(op=op, actor=actor, bucket=bucket, part=part, start=start, end=end, nbytes=nbytes,
                             node=node, step=step, cpu=thread[0] if thread else None,
                             queued=thread[1] if len(thread) > 1 else None))
            if op == "send":
                send_end[node] = end
    if send_of:
        for row in rows:
            if row["op"] == "recv" and row["node"] in send_of:
                row["start"] = min(send_end.get(send_of[row["node"]], row["start"]), row["start"])
    return sorted(rows, key=lambda r: r["start"])


#: The ops a rank's compute threads run (receives only mark a payload's arrival).
THREAD_OPS = ("encode", "decode", "merge", "send")


def op_time_split(rows: list[dict[str, Any]]) -> dict[str, float] | None:
    """Where the compute threads' op time went, in seconds per actor (the mean over the actors of one step's
    rows): ``wall`` (the ops' wall time, summed), ``cpu`` (their threads' own CPU), ``queued`` (runnable, waiting
    for a core) and ``blocked`` (the rest: not runnable inside an op, which for ops that take no lock is waiting
    for the GIL); ``ops`` per actor.  None where the rows carry no CPU or run-queue times (another engine's, or
    not Linux)."""
    ops = [r for r in rows if r["op"] in THREAD_OPS]
    if not ops or any(r.get("cpu") is None or r.get("queued") is None for r in ops):
        return None
    actors = {r["actor"] for r in ops}
    wall = sum(r["end"] - r["start"] for r in ops)
    cpu = sum(r["cpu"] for r in ops)
    queued = sum(r["queued"] for r in ops)
    per = len(actors)
    return {"ops": len(ops) / per, "wall": wall / per, "cpu": cpu / per, "queued": queued / per,
            "blocked": max(0.0, wall - cpu - queued) / per}


class TimelineBuffer:
    """Rows of the last :data:`TIMELINE_STEPS_KEPT` steps."""

    def __init__(self, keep: int = TIMELINE_STEPS_KEPT):
        self.keep = keep
        self._rows: list[dict[str, Any]] = []

    def add(self, step: int, rows: list[dict[str, Any]]) -> None:
        self._rows.extend(rows)
        oldest = step - self.keep
        if self._rows and self._rows[0]["step"] <= oldest:
            self._rows = [r for r in self._rows if r["step"] > oldest]

    def rows(self, step: int | None = None, relative: bool = True) -> list[dict[str, Any]]:
        """Copies of the rows (of one step, or all kept), times relative to the first row's start (or, with
        ``relative=False``, seconds since the epoch as the actors' clocks read them)."""
        rows = [dict(r) for r in self._rows if step is None or r["step"] == step]
        if rows and relative:
            t0 = min(r["start"] for r in rows)
            for r in rows:
                r["start"] -= t0
                r["end"] -= t0
        return rows

    def clear(self) -> None:
        self._rows = []
