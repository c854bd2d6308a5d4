"""Where the per-rank executor keeps error-feedback residuals from one step to the next.

A plain ``dict`` of arrays is what every engine, checkpoint and test reads.  :class:`Residuals` is the same
mapping, except that an encode may store a residual whose decoded payload is still to be subtracted
(:class:`~casync.primitives.codecs.residual.DeferredResidual`): the next step's encode of that key then computes
it as it adds it.  Whoever else reads a residual gets an array, computed on the spot, so no reader outside the encodes
ever sees the deferred form.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

import numpy as np

from .codecs.residual import DeferredResidual, buffer_of, materialized


class Residuals(MutableMapping):
    """Error-feedback residuals by key.

    Reading one (``residuals[key]``, ``get``, ``items``, ``dict(residuals)``, a pickle's reader) gives a float32
    array; a deferred residual is materialized into a fresh array on each read, and nothing stored changes.
    The encodes (:func:`casync.primitives.ops.run_encode`) use :meth:`raw` and may store deferred residuals, but only
    in a ``Residuals``: a plain dict handed to them holds arrays only, as before."""

    def __init__(self, entries: Mapping[str, Any] | None = None):
        self._entries: dict[str, Any] = dict(entries._entries if isinstance(entries, Residuals) else entries or {})

    def __getitem__(self, key: str) -> np.ndarray:
        return materialized(self._entries[key])

    def __setitem__(self, key: str, value: Any) -> None:
        self._entries[key] = value

    def __delitem__(self, key: str) -> None:
        del self._entries[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def raw(self, key: str, default: Any = None) -> Any:
        """The stored form of ``key``'s residual: an array or a :class:`DeferredResidual`."""
        return self._entries.get(key, default)

    def restore(self, key: str, stored: Any) -> None:
        """Put back what :meth:`raw` gave for ``key`` (None: no residual), undoing an encode's write."""
        if stored is None:
            self._entries.pop(key, None)
        else:
            self._entries[key] = stored

    def deferred(self) -> int:
        """How many residuals are held deferred."""
        return sum(isinstance(v, DeferredResidual) for v in self._entries.values())

    def __repr__(self) -> str:
        return f"Residuals({len(self)} keys, {self.deferred()} deferred)"


def stored(residuals: MutableMapping[str, Any] | None, key: str) -> Any:
    """``key``'s residual as stored: deferred where ``residuals`` is a :class:`Residuals` that holds it so."""
    if residuals is None:
        return None
    return residuals.raw(key) if isinstance(residuals, Residuals) else residuals.get(key)


def buffers(residuals: Mapping[str, Any] | None) -> dict[str, np.ndarray]:
    """The arrays ``residuals`` hold memory in, by key (a deferred residual's corrected tensor): what a step
    that will never read them again may write its new residuals into."""
    if isinstance(residuals, Residuals):
        return {k: buffer_of(residuals.raw(k)) for k in residuals}
    return dict(residuals or {})
