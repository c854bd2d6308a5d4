"""Per-step training records and the history ``Trainer.fit`` returns (writable as CSV or JSON)."""
from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable


@dataclass
class StepRecord:
    """What one training step did, averaged over workers where it is per worker.

    ``sync_s`` is a worker's synchronization window (first sync op start to last sync op end);
    ``exposed_sync_s`` the part of it during which the worker was not computing (forward/backward);
    ``hidden_fraction`` = 1 - exposed/sync.  ``sync_cpu_s``: the CPU time a worker's sync ops took (each op's
    own thread time, waiting for a core or for data left out): with ``W`` workers sharing ``C`` cores, the
    window cannot be shorter than ``W * sync_cpu_s / C``.  ``bytes_sent`` counts every payload put on the wire by every
    actor; ``compression_ratio`` compares it with the float32 bytes the same sends would carry.
    ``nonfinite`` names each (worker, parameter) whose gradient held NaN/Inf; ``skipped``: the update was
    skipped for it on every worker (``nonfinite="skip"``).
    """

    step: int
    loss: float
    samples: int
    step_s: float
    throughput: float
    compute_s: float
    sync_s: float
    exposed_sync_s: float
    hidden_fraction: float
    bytes_sent: int
    raw_bytes: int
    compression_ratio: float
    full_precision: bool = False
    density: float | None = None
    replicas_checked: bool = False
    skipped: bool = False
    nonfinite: list[str] = field(default_factory=list)
    sync_cpu_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class History(list):
    """A list of :class:`StepRecord` with CSV/JSON export and column access."""

    def __init__(self, records: Iterable[StepRecord] = ()):
        super().__init__(records)

    def column(self, name: str) -> list[Any]:
        if name not in {f.name for f in fields(StepRecord)}:
            raise KeyError(f"no column {name!r}; columns: {[f.name for f in fields(StepRecord)]}")
        return [getattr(r, name) for r in self]

    def mean(self, name: str, skip: int = 0) -> float:
        """Mean of a numeric column, leaving out the first ``skip`` steps (warm-up of caches and Ray)."""
        values = self.column(name)[skip:]
        return float(sum(values) / len(values)) if values else float("nan")

    def to_dicts(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self]

    def to_csv(self, path: str | Path) -> Path:
        path = Path(path)
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=[f.name for f in fields(StepRecord)])
            writer.writeheader()
            writer.writerows(self.to_dicts())
        return path

    def to_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dicts(), indent=1) + "\n")
        return path

    @classmethod
    def from_json(cls, path: str | Path) -> "History":
        return cls(StepRecord(**row) for row in json.loads(Path(path).read_text()))
