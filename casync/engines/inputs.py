"""Check and convert per-worker gradients; restore the caller's array type on the way out.

Accepts NumPy arrays and torch tensors (any float dtype, any device: copied to CPU float32).  Every
mistake raises a ``TypeError``/``ValueError`` naming the worker, the tensor and what was expected.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..plan.syncplan import SyncPlan


def _is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def _as_float32(value: Any, worker: int, name: str) -> np.ndarray:
    if _is_torch(value):
        if not value.is_floating_point():
            raise TypeError(f"worker {worker}, tensor {name!r}: expected a floating-point tensor, got {value.dtype}")
        import torch

        if value.layout != torch.strided or value.device.type == "meta":
            raise TypeError(f"worker {worker}, tensor {name!r}: expected a dense tensor with data, got layout "
                            f"{value.layout} on device {value.device.type!r}")
        value = value.detach()
        try:
            if value.dtype != torch.float32 or value.device.type != "cpu":
                value = value.to(device="cpu", dtype=torch.float32)
            return value.numpy()
        except (RuntimeError, TypeError, NotImplementedError) as exc:
            raise TypeError(f"worker {worker}, tensor {name!r}: cannot read this tensor as float32 on the CPU "
                            f"({exc})") from None
    if isinstance(value, np.ma.MaskedArray):
        raise TypeError(f"worker {worker}, tensor {name!r}: masked arrays are not supported (their masked values "
                        "would be used as they are); pass .filled(0) or a plain array")
    if not isinstance(value, np.ndarray):
        if isinstance(value, (np.floating, float)):
            value = np.asarray(value)
        else:
            raise TypeError(f"worker {worker}, tensor {name!r}: expected a numpy.ndarray or torch.Tensor, "
                            f"got {type(value).__name__}")
    if not np.issubdtype(value.dtype, np.floating):
        raise TypeError(f"worker {worker}, tensor {name!r}: expected a floating-point array, got dtype {value.dtype}")
    return value.astype(np.float32, copy=False)


def flatten_worker_grads(plan: SyncPlan, grads: Any) -> tuple[list[dict[str, np.ndarray]], list[dict[str, bool]]]:
    """Per worker, per bucket: a fresh contiguous float32 buffer; plus which inputs were torch tensors."""
    if isinstance(grads, Mapping) or not isinstance(grads, Sequence) or isinstance(grads, (str, bytes)):
        raise TypeError(f"grads must be a list with one mapping name->array per worker, got {type(grads).__name__}")
    if len(grads) != plan.workers:
        raise ValueError(f"grads has {len(grads)} entries but the plan has {plan.workers} workers")
    expected = {t.name: t for t in plan.tensors}
    flats, torch_flags = [], []
    for w, worker_grads in enumerate(grads):
        if not isinstance(worker_grads, Mapping):
            raise TypeError(f"worker {w}: expected a mapping name->array, got {type(worker_grads).__name__}")
        missing = [n for n in expected if n not in worker_grads]
        extra = [n for n in worker_grads if n not in expected]
        if missing:
            raise ValueError(f"worker {w}: missing gradient for tensor(s) {missing[:5]}"
                             + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
        if extra:
            raise ValueError(f"worker {w}: unexpected tensor(s) {extra[:5]} not in the plan")
        buffers = {}
        flags = {name: _is_torch(value) for name, value in worker_grads.items()}  # caller's key order
        for bucket in plan.buckets:
            flat = np.empty(bucket.numel, dtype=np.float32)
            for m in bucket.members:
                value = worker_grads[m.spec.name]
                array = _as_float32(value, w, m.spec.name)
                if tuple(array.shape) != m.spec.shape:
                    raise ValueError(f"worker {w}, tensor {m.spec.name!r}: expected shape {m.spec.shape}, "
                                     f"got {tuple(array.shape)}")
                flat[m.offset:m.stop] = array.reshape(-1)
            buffers[bucket.name] = flat
        flats.append(buffers)
        torch_flags.append(flags)
    return flats, torch_flags


def unflatten_results(plan: SyncPlan, results: list[dict[str, np.ndarray]],
                      torch_flags: list[dict[str, bool]]) -> list[dict[str, Any]]:
    """Per worker: tensor name -> result shaped like the input, as NumPy or torch like the input, in the
    caller's key order."""
    out = []
    for w, buffers in enumerate(results):
        worker_out: dict[str, Any] = {}
        for name, is_torch in torch_flags[w].items():
            bucket, member = plan.locate(name)
            array = buffers[bucket.name][member.offset:member.stop].reshape(member.spec.shape)
            if is_torch:
                import torch

                array = torch.from_numpy(array)
            worker_out[name] = array
        out.append(worker_out)
    return out


def check_flats(plan: SyncPlan, flats: Any, mappings_only: bool = False) -> None:
    """Validate per-worker flat bucket buffers handed to ``run_flat`` (dicts; other entries, such as ObjectRefs
    of them, are checked where they are read, unless ``mappings_only``: then they are refused): every bucket,
    1-D float32 of the bucket's length."""
    if not isinstance(flats, Sequence) or isinstance(flats, (str, bytes)):
        raise TypeError(f"flats must be a list with one mapping bucket->array per worker, got {type(flats).__name__}")
    if len(flats) != plan.workers:
        raise ValueError(f"flats has {len(flats)} entries but the plan has {plan.workers} workers")
    names = {bucket.name for bucket in plan.buckets}
    for w, buffers in enumerate(flats):
        if not isinstance(buffers, Mapping):
            if mappings_only:
                raise TypeError(f"worker {w}: expected a mapping bucket->array, got {type(buffers).__name__}")
            continue
        extra = [k for k in buffers if k not in names]
        if extra:
            raise ValueError(f"worker {w}: unexpected bucket(s) {extra[:5]} not in the plan (its buckets: "
                             f"{sorted(names)[:5]})")
        for bucket in plan.buckets:
            array = buffers.get(bucket.name)
            if not isinstance(array, np.ndarray) or array.dtype != np.float32 or array.shape != (bucket.numel,):
                got = f"{array.dtype}{array.shape}" if isinstance(array, np.ndarray) else type(array).__name__
                raise ValueError(f"worker {w}, bucket {bucket.name!r}: expected a flat float32 array of shape "
                                 f"({bucket.numel},), got {got}")


def check_result_buffers(actor: str, out: Mapping[str, np.ndarray], sizes: Mapping[str, int]
                         ) -> dict[str, np.ndarray]:
    """``out`` (an executor's ``begin(out=)``: bucket -> where to write its result) checked against the buckets'
    sizes: one writeable contiguous float32 array of each bucket's size per bucket, or a ValueError naming it."""
    if set(out) != set(sizes):
        raise ValueError(f"{actor}: out= must have one buffer per bucket {sorted(sizes)}, got {sorted(out)}")
    for b, n in sizes.items():
        buf = out[b]
        if not (isinstance(buf, np.ndarray) and buf.dtype == np.float32 and buf.shape == (n,)
                and buf.flags.c_contiguous and buf.flags.writeable):
            raise ValueError(f"{actor}: out[{b!r}] must be a writeable contiguous float32 array of shape "
                             f"({n},), got {getattr(buf, 'dtype', type(buf).__name__)} {getattr(buf, 'shape', '')}")
    return dict(out)


def random_grads(plan: SyncPlan, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Gaussian gradients per worker, shaped like the plan's tensors (a stand-in for a backward pass)."""
    rng = np.random.default_rng(seed)
    return [{t.name: rng.standard_normal(t.shape, dtype=np.float32) for t in plan.tensors}
            for _ in range(plan.workers)]


def check_compute_threads(value: Any, who: str = "") -> int:
    """``value`` as a number of compute threads (an int >= 1), or a ValueError naming ``who``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{who + ': ' if who else ''}compute_threads must be an int >= 1, got {value!r}")
    return value
