"""Typed failures of the engines; input mistakes raise plain ``TypeError`` / ``ValueError`` (or subclasses)."""
from __future__ import annotations

from typing import Any


class SyncError(RuntimeError):
    """Base of every engine failure (a lost actor, a timeout, an inconsistent result)."""


class WorkerLostError(SyncError):
    """An actor of the plan died (or its node went away) during a sync; ``lost`` names it where known."""

    def __init__(self, message: str, lost: str | None = None):
        super().__init__(message)
        self.lost = lost

    def __reduce__(self):  # picklable across processes (Ray, a rank's pipe) with what it names
        return (type(self), (str(self), self.lost))


class SyncTimeoutError(SyncError, TimeoutError):
    """A sync did not finish within the engine's ``timeout_s``."""


class ResourcesUnavailableError(SyncTimeoutError):
    """An engine's actors cannot be placed: the cluster lacks the CPUs, or other engines hold them."""


class ReplicaMismatchError(SyncError):
    """Workers that must hold bit-identical values do not."""


class PlanMismatchError(ReplicaMismatchError):
    """Ranks of one job built different sync plans (other options, another model or other buckets): their
    transfers would not match, so nothing is sent."""


class NonFiniteGradientError(SyncError, ValueError):
    """A worker's gradient holds NaN or Inf and the plan's ``nonfinite`` mode is ``"raise"``.

    ``reports`` lists every offending (worker, tensor) with its NaN and Inf counts.  Nothing was
    synchronized: the engine's step and error-feedback state are as before the call, and it stays usable.
    ``step``: the training step, when a Trainer raised it.
    """

    def __init__(self, reports: list[Any], step: int | None = None):
        self.reports = list(reports)
        self.step = step
        shown = "; ".join(str(r) for r in self.reports[:5])
        more = f"; and {len(self.reports) - 5} more" if len(self.reports) > 5 else ""
        when = f"step {step}: " if step is not None else ""
        super().__init__(f"{when}non-finite gradient values: {shown}{more} (build_plan(nonfinite='skip') skips "
                         "such steps on every worker, 'propagate' passes NaN/Inf through)")

    def __reduce__(self):  # picklable across processes with its reports
        return (type(self), (self.reports, self.step))


class PlanError(ValueError):
    """A plan breaks the rules of the plan IR (``casync.plan.lint``); the message names the node or field."""


class PlanFormatError(PlanError):
    """A plan file (or dict) is not a valid casync plan; the message names the file and the field."""
