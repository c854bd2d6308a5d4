"""Turn what a user hands ``build_plan`` (shapes, a torch module, a model name) into tensor specs."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from .specs import TensorSpec


def _is_torch_module(obj: Any) -> bool:
    return any(c.__module__.startswith("torch.nn") and c.__name__ == "Module" for c in type(obj).__mro__)


def _shape(name: str, shape: Any) -> tuple[int, ...]:
    if hasattr(shape, "shape") and hasattr(shape, "dtype"):  # an array or tensor where a shape belongs
        raise TypeError(f"tensor {name!r}: expected a shape, got a {type(shape).__name__}; pass its .shape "
                        f"(e.g. {{name: p.shape for name, p in model.named_parameters()}}) or the torch module")
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(f"tensor {name!r}: shape must be a tuple of ints, got {shape!r}") from None
    for d in dims:
        if isinstance(d, bool) or not hasattr(d, "__index__"):
            raise TypeError(f"tensor {name!r}: shape must be a tuple of ints, got {shape!r}")
        if int(d) < 0:
            raise ValueError(f"tensor {name!r}: negative dimension in shape {shape!r}")
    return tuple(int(d) for d in dims)


def tensor_specs(tensors: Any) -> list[TensorSpec]:
    """Specs in backward order (the order gradients become ready).

    * a built-in model name: its shape table, reversed registration order;
    * a ``torch.nn.Module``: parameters that require grad, reversed registration order;
    * a mapping ``name -> shape`` or a list of ``(name, shape)``: taken as already in backward order.
    """
    if isinstance(tensors, str):
        from .models import model_tensors

        pairs: Iterable[tuple[str, Any]] = model_tensors(tensors)
    elif _is_torch_module(tensors):
        named = [(n, tuple(p.shape)) for n, p in tensors.named_parameters() if p.requires_grad]
        pairs = list(reversed(named))
    elif isinstance(tensors, Mapping):
        pairs = list(tensors.items())
    elif isinstance(tensors, (list, tuple)):
        pairs = []
        for i, item in enumerate(tensors):
            if isinstance(item, TensorSpec):
                pairs.append((item.name, item.shape))
                continue
            if not (isinstance(item, (list, tuple)) and len(item) == 2):
                raise TypeError(f"tensors[{i}] must be a (name, shape) pair, got {item!r}")
            pairs.append((item[0], item[1]))
    else:
        raise TypeError(
            "tensors must be a dict name->shape, a list of (name, shape), a torch.nn.Module or a built-in "
            f"model name; got {type(tensors).__name__}")
    specs, seen = [], set()
    for name, shape in pairs:
        if not isinstance(name, str) or not name:
            raise TypeError(f"tensor names must be non-empty strings, got {name!r}")
        if name in seen:
            raise ValueError(f"tensor {name!r} appears twice")
        seen.add(name)
        specs.append(TensorSpec(name, _shape(name, shape)))
    if not specs:
        raise ValueError("no tensors to synchronize (empty model or mapping)")
    return specs
