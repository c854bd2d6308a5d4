"""A trainer's constructor arguments as JSON, for its checkpoint: codec specs, and the planner's inputs that
are objects (a :class:`~casync.sim.costmodel.ClusterModel`, a :class:`~casync.sim.costmodel.Profile`), so
that ``Trainer.load`` rebuilds the same plan without being handed them again."""
from __future__ import annotations

import json
from typing import Any

from casync.primitives.codecs import get_codec

from ..sim.costmodel import ClusterModel, Profile

_TYPE = "__casync_type__"  # marks an object saved as a dict (a plain dict option never has this key)


def codec_to_json(codec: Any) -> Any:
    if codec is None or isinstance(codec, str):
        return codec
    if isinstance(codec, list):
        return [codec_to_json(c) for c in codec]
    name, params = get_codec(codec).spec()
    return {"name": name, "params": params}


def codec_from_json(value: Any) -> Any:
    if isinstance(value, dict):
        return (value["name"], value["params"])
    if isinstance(value, list):
        return [codec_from_json(v) for v in value]
    return value


def options_to_json(options: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``(saved, left out)``: the options as JSON values, and the names of those that are neither JSON nor a
    ClusterModel or Profile (``Trainer.load`` must be handed them again)."""
    kept, dropped = {}, []
    for key, value in options.items():
        if isinstance(value, (ClusterModel, Profile)):
            kept[key] = {_TYPE: type(value).__name__, "value": value.to_dict()}
            continue
        try:
            json.dumps(value)
            kept[key] = value
        except TypeError:
            dropped.append(key)
    return kept, dropped


def options_from_json(options: dict[str, Any], source: str) -> dict[str, Any]:
    """The options :func:`options_to_json` saved, with ClusterModel and Profile objects rebuilt."""
    out = {}
    for key, value in options.items():
        if isinstance(value, dict) and _TYPE in value:
            kind, data = value[_TYPE], value["value"]
            if kind == "ClusterModel":
                value = ClusterModel(**data)
            elif kind == "Profile":
                value = Profile.from_dict(data, source=f"{source}: {key}")
            else:
                raise ValueError(f"{source}: plan option {key!r} holds an unknown saved type {kind!r}")
        out[key] = value
    return out
