"""The Trainer's own options (everything that is not a ``build_plan`` option), validated in one place."""
from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass
from typing import Any

#: Default bucket size for training: small enough that a model's late layers form buckets of their own,
#: whose sync starts while back-propagation continues (build_plan's 25 MiB default suits sync-only runs).
TRAIN_BUCKET_BYTES = 1 << 20


def _int(name: str, value: Any, minimum: int, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _real(name: str, value: Any, low: float, high: float, closed_high: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not (low <= value <= high if closed_high else low <= value < high):
        raise ValueError(f"{name} must be in [{low}, {high}{']' if closed_high else ')'}, got {value}")


def check_keepers(momentum_correction: float | None, momentum_masking: bool, warmup_steps: int,
                  warmup_start_ratio: float, delayed_update: bool, full_sync_every: int | None) -> None:
    """The DGC and CD-SGD options' values and the combinations that cannot work (shared with ``casync.torch``)."""
    if momentum_correction is not None:
        _real("momentum_correction", momentum_correction, 0.0, 1.0)
    for flag, value in (("momentum_masking", momentum_masking), ("delayed_update", delayed_update)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be True or False, got {value!r}")
    if momentum_masking and momentum_correction is None:
        raise ValueError("momentum_masking masks the corrected momentum: set momentum_correction too")
    if momentum_masking and delayed_update:
        raise ValueError("momentum_masking needs step t's sent coordinates before step t+1's backward, "
                         "which delayed_update overlaps with step t's sync; use one or the other")
    _int("warmup_steps", warmup_steps, 0)
    _real("warmup_start_ratio", warmup_start_ratio, 0.0, 1.0, closed_high=True)
    if warmup_start_ratio == 0:
        raise ValueError("warmup_start_ratio must be > 0")
    _int("full_sync_every", full_sync_every, 1, allow_none=True)


@dataclass(frozen=True)
class TrainOptions:
    """Compression-aware optimisation and runtime settings of a :class:`casync.Trainer`.

    * ``momentum_correction``: DGC momentum correction with this factor: each worker keeps its own momentum
      ``u = m*u + g`` and synchronizes ``u`` (error feedback accumulates it), instead of applying momentum to
      the compressed average.  The optimizer must then have no momentum of its own.
    * ``momentum_masking``: DGC momentum-factor masking: after a step, ``u`` is zeroed where this worker's
      error-feedback residual is zero, i.e. where its accumulated value was sent (sparse codecs only).
    * ``warmup_steps``, ``warmup_start_ratio``: DGC sparsity warm-up: a sparse codec keeps
      ``start * (ratio/start)**(step/warmup_steps)`` of the elements during the first steps, falling
      geometrically to its own ratio.
    * ``delayed_update``: CD-SGD-style one-step delay: step t's update is applied while step t+1 computes its
      gradients (on parameters that lack step t's update), so synchronization overlaps a whole step.
    * ``full_sync_every``: every k-th step synchronizes uncompressed (same strategy and partitions, codec
      ``none``); error-feedback residuals are kept for the next compressed step.
    * ``check_every``: compare a hash of every worker's parameters every k steps (and at start and save);
      a mismatch raises :class:`casync.ReplicaMismatchError`.
    * ``transport``: the data plane between the actors, ``"direct"`` (shared memory on a node, gloo between
      nodes), ``"tcp"`` (shared memory on a node, TCP sockets between nodes) or ``"gloo"`` (gloo everywhere);
      see ``casync.runtime.ray_engine``.
    * ``compute_threads``: sync ops each actor runs at once (``RayEngine``'s meaning): more where every worker
      has cores of its own; on a machine whose cores the workers already fill, 1.
    """

    seed: int = 0
    momentum_correction: float | None = None
    momentum_masking: bool = False
    warmup_steps: int = 0
    warmup_start_ratio: float = 0.25
    delayed_update: bool = False
    full_sync_every: int | None = None
    check_every: int = 10
    timeout_s: float = 120.0
    torch_threads: int = 1
    deterministic: bool = True
    cpus_per_worker: float = 1.0
    placement: str = "spread"
    transport: str = "direct"
    compute_threads: int = 1

    def __post_init__(self) -> None:
        _int("seed", self.seed, 0)
        if not isinstance(self.deterministic, bool):
            raise TypeError(f"deterministic must be True or False, got {self.deterministic!r}")
        check_keepers(self.momentum_correction, self.momentum_masking, self.warmup_steps, self.warmup_start_ratio,
                      self.delayed_update, self.full_sync_every)
        _int("check_every", self.check_every, 1)
        _real("timeout_s", self.timeout_s, 1e-3, float("inf"))
        _int("torch_threads", self.torch_threads, 1)
        _int("compute_threads", self.compute_threads, 1)
        _real("cpus_per_worker", self.cpus_per_worker, 0.0, float("inf"))
        if self.placement not in ("spread", "pack"):
            raise ValueError(f"placement must be 'spread' or 'pack', got {self.placement!r}")
        if self.transport not in ("direct", "tcp", "gloo"):
            raise ValueError(f"transport must be 'direct', 'tcp' or 'gloo', got {self.transport!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
