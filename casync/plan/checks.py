"""Validation of user-facing options, shared by ``build_plan`` and the planner: errors name the option."""
from __future__ import annotations

import numbers
from typing import Any

MAX_PARTITIONS = 1 << 16


def check_int(name: str, value: Any, minimum: int, allow_none: bool = False) -> Any:
    """``value`` as a Python int (NumPy integers accepted), or None where allowed."""
    if value is None and allow_none:
        return None
    if type(value) is int:  # the common case, without the ABC checks below
        if value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value}")
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def check_op(op: Any) -> None:
    if op not in ("mean", "sum"):
        raise ValueError(f"op must be 'mean' or 'sum', got {op!r}")


def check_partitions(partitions: Any) -> int | None:
    partitions = check_int("partitions", partitions, 1, allow_none=True)
    if partitions is not None and partitions > MAX_PARTITIONS:
        raise ValueError(f"partitions={partitions} is more than the supported maximum {MAX_PARTITIONS}")
    return partitions


NONFINITE_MODES = ("raise", "skip", "propagate")


def check_nonfinite(mode: Any) -> str:
    """Validate a ``nonfinite`` option (what engines do with NaN/Inf gradients; see ``casync.engines.nonfinite``)."""
    if not isinstance(mode, str):
        raise TypeError(f"nonfinite must be one of {list(NONFINITE_MODES)}, got {mode!r} ({type(mode).__name__})")
    if mode not in NONFINITE_MODES:
        raise ValueError(f"nonfinite must be one of {list(NONFINITE_MODES)}, got {mode!r}")
    return mode
