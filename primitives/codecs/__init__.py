"""The codec library: a registry of gradient compressors behind one contract.

Usage::

    from casync.primitives.codecs import get_codec
    c = get_codec("topk:ratio=0.01")       # or ("topk", {"ratio": 0.01}), or c.spec()
    payload = c.encode(x, seed=0)          # dict of NumPy arrays; x: 1-D float32
    y = c.decode(payload, x.size)          # fresh float32 array

Adding a codec: subclass :class:`Codec`, set ``name``, implement ``encode``,
``decode``, ``compressed_nbytes`` (and ``params`` if it takes any), and decorate
it with :func:`register_codec`; ``get_codec("yourname:param=value")`` then works.
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Union

from .base import Codec, Payload, payload_nbytes
from .dense import FP16Codec, NoneCodec
from .dithering import DitheringCodec
from .natural import NaturalCodec
from .qsgd import QSGDCodec
from .sign import OneBitCodec
from .signs import SignSGDCodec, TwoScaleOneBitCodec
from .sketch import SketchCodec
from .sparse import RandomKCodec, TopKCodec
from .ternary import TBQCodec, TernGradCodec
from .u8bit import U8BitCodec

__all__ = [
    "ALIASES",
    "Codec",
    "CodecSpec",
    "Payload",
    "available_codecs",
    "codec_class",
    "get_codec",
    "parse_spec",
    "payload_nbytes",
    "register_codec",
    "unregister_codec",
]

#: What :func:`get_codec` accepts.
CodecSpec = Union[None, str, tuple, Codec]

_REGISTRY: dict[str, type[Codec]] = {}

#: Other libraries' names for a registered codec, each shown equal to that library's definition in a test
#: (``tests/primitives/test_grace_codecs.py``): ``get_codec`` accepts them and returns the codec they stand for.
ALIASES: dict[str, str] = {"efsignsgd": "onebit"}


def register_codec(cls: type[Codec]) -> type[Codec]:
    """Class decorator: make ``cls`` available to :func:`get_codec` under ``cls.name``.

    Registering another class under a taken name is an error (re-registering
    the same class, e.g. on module reload, is not).
    """
    if not (isinstance(cls, type) and issubclass(cls, Codec)):
        raise TypeError(f"register_codec expects a Codec subclass, got {cls!r}")
    if inspect.isabstract(cls):
        raise TypeError(f"cannot register abstract codec class {cls.__qualname__}")
    name = cls.name
    if not isinstance(name, str) or not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(
            f"codec class {cls.__qualname__} needs a 'name' of letters, digits, '_' or '-', got {name!r}"
        )
    if name in ALIASES:
        raise ValueError(f"codec name {name!r} is an alias of {ALIASES[name]!r}; pick another name")
    old = _REGISTRY.get(name)
    if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"codec name {name!r} is already registered by {old.__module__}.{old.__qualname__}")
    _REGISTRY[name] = cls
    return cls


def unregister_codec(name: str) -> None:
    """Remove a registered codec (mainly for tests and plugins that clean up)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown codec {name!r}; available: {', '.join(available_codecs())}")
    del _REGISTRY[name]


def codec_class(key: str) -> type[Codec] | None:
    """The registered class of a codec key (``str(codec)``, e.g. ``"topk(ratio=0.01)"``) or spec
    (``"topk:ratio=0.01"``), None if its name is not registered."""
    return _REGISTRY.get(key.split("(", 1)[0].split(":", 1)[0])


def available_codecs() -> list[str]:
    """Registered codec names, sorted."""
    return sorted(_REGISTRY)


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Split ``"name"`` or ``"name:key=value,key=value"`` into ``(name, params)``.

    Values become int, float or bool (``true``/``false``) where they parse as one,
    else stay strings.
    """
    name, _, rest = spec.partition(":")
    name = name.strip()
    params: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ValueError(f"codec {name!r}: expected 'key=value' in spec {spec!r}, got {item!r}")
        if key in params:
            raise ValueError(f"codec {name!r}: parameter {key!r} given twice in spec {spec!r}")
        params[key] = _parse_value(value.strip())
    return name, params


def _parse_value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def get_codec(spec: CodecSpec = None) -> Codec:
    """Build a codec from a spec.

    Accepted forms: ``None`` or ``"none"`` (identity), a registered name
    (``"onebit"``), a name with parameters (``"topk:ratio=0.01"``), a tuple
    ``(name, {params})`` (what :meth:`Codec.spec` returns) or a :class:`Codec`
    instance, returned as is.  Unknown names and bad parameters raise
    ValueError; a spec of another type raises TypeError.
    """
    if spec is None:
        name, params = "none", {}
    elif isinstance(spec, Codec):
        return spec
    elif isinstance(spec, str):
        name, params = parse_spec(spec)
    elif isinstance(spec, tuple):
        if len(spec) != 2 or not isinstance(spec[0], str) or not isinstance(spec[1], Mapping):
            raise TypeError(f"a codec spec tuple must be (name: str, params: Mapping), got {spec!r}")
        name, params = spec[0], dict(spec[1])
        if not all(isinstance(key, str) for key in params):
            raise TypeError(f"codec parameter names must be strings, got {list(params)!r}")
    else:
        raise TypeError(
            "a codec spec must be None, a str, a (name, params) tuple or a Codec, "
            f"got {type(spec).__name__}"
        )
    cls = _REGISTRY.get(ALIASES.get(name, name))
    if cls is None:
        raise ValueError(f"unknown codec {name!r}; available: {', '.join(available_codecs())}")
    accepted = _parameters(cls)
    if accepted is not None:
        unknown = sorted(set(params) - set(accepted))
        if unknown:
            raise ValueError(
                f"codec {name!r} has no parameter {unknown[0]!r}; "
                f"accepted: {', '.join(accepted) if accepted else 'none'}"
            )
    return cls(**params)


def _parameters(cls: type[Codec]) -> list[str] | None:
    """Keyword parameters of ``cls.__init__`` (None when it takes ``**kwargs``)."""
    if cls.__init__ is object.__init__:
        return []
    names = []
    for p in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if p.kind is p.VAR_KEYWORD:
            return None
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            names.append(p.name)
    return names


for _cls in (NoneCodec, FP16Codec, OneBitCodec, TernGradCodec, TBQCodec, QSGDCodec, TopKCodec, RandomKCodec,
             SignSGDCodec, TwoScaleOneBitCodec, NaturalCodec, U8BitCodec, SketchCodec, DitheringCodec):
    register_codec(_cls)
del _cls
