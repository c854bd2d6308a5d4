"""The measured timeline an engine keeps: per-op rows of its recent steps, bounded in memory."""
from __future__ import annotations

from typing import Any

TIMELINE_STEPS_KEPT = 16  # timeline() covers the most recent iterations only


def op_rows(step: int, records: dict[str, list[tuple]], send_of: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Per-actor op records ``(op, bucket, part, start, end, nbytes, node[, cpu])`` as rows sorted by start
    (``cpu`` None where a record has none, e.g. a Trainer's forward/backward/update rows).

    ``send_of``: recv node -> its send node; a recv row then spans from the moment its payload was sent to
    the moment it was used."""
    send_end: dict[str, float] = {}
    rows = []
    for actor, actor_records in records.items():
        for op, bucket, part, start, end, nbytes, node, *cpu in actor_records:
            rows.append(dict(op=op, actor=actor, bucket=bucket, part=part, start=start, end=end, nbytes=nbytes,
                             node=node, step=step, cpu=cpu[0] if cpu else None))
            if op == "send":
                send_end[node] = end
    if send_of:
        for row in rows:
            if row["op"] == "recv" and row["node"] in send_of:
                row["start"] = min(send_end.get(send_of[row["node"]], row["start"]), row["start"])
    return sorted(rows, key=lambda r: r["start"])


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
