"""Typed failures of the engines; input mistakes raise plain ``TypeError`` / ``ValueError``."""


class SyncError(RuntimeError):
    """Base of every engine failure (a lost actor, a timeout, an inconsistent result)."""


class WorkerLostError(SyncError):
    """An actor of the plan died (or its node went away) during a sync."""


class SyncTimeoutError(SyncError, TimeoutError):
    """A sync did not finish within the engine's ``timeout_s``."""


class ReplicaMismatchError(SyncError):
    """Workers that must hold bit-identical values do not."""
