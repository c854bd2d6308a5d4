"""Built-in model zoo: parameter shape tables for well-known architectures.

Gradient-sync strategies only need each parameter's name and shape, not the
network itself, so the published architectures are described here as pure
Python tables (no torch needed).  Names follow PyTorch / HuggingFace
``named_parameters()`` conventions and lists are in registration order;
:func:`model_tensors` gives the reverse (backward) order, which is the order in
which gradients become ready during backpropagation.

Models:

* ``resnet50`` -- torchvision ResNet-50, 1000 classes: 25,557,032 params, 161 tensors.
* ``vgg16``    -- torchvision VGG-16 (no BN), 1000 classes: 138,357,544 params, 32 tensors.
* ``bert-base``-- HF ``BertModel`` (bert-base-uncased, with pooler): 109,482,240 params, 199 tensors.
* ``gpt2``     -- HF ``GPT2Model`` (small; LM head tied, not counted): 124,439,808 params, 148 tensors.
* ``mlp``      -- small MLP 64 (8x8 digits) -> 2048 -> 2048 -> 10: 4,349,962 params, 6 tensors.
* ``tiny``     -- toy net with odd-sized 1-D and 2-D tensors (no 0-d): 129 params, 7 tensors.

Only ``mlp`` and ``tiny`` can be built as real ``torch.nn.Module`` objects
(:func:`build_torch_model`); torch is imported lazily for that.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

Shape = tuple[int, ...]
ShapeTable = list[tuple[str, Shape]]

__all__ = [
    "MODELS",
    "ALIASES",
    "TORCH_MODELS",
    "MLP_DIMS",
    "model_names",
    "model_shapes",
    "model_tensors",
    "model_num_params",
    "build_torch_model",
]


# --------------------------------------------------------------------------
# Small helpers for common layer types (registration order of torch.nn).
# --------------------------------------------------------------------------

def _linear(prefix: str, in_f: int, out_f: int, bias: bool = True) -> ShapeTable:
    """nn.Linear: weight (out, in) then bias (out,)."""
    out: ShapeTable = [(f"{prefix}.weight", (out_f, in_f))]
    if bias:
        out.append((f"{prefix}.bias", (out_f,)))
    return out


def _conv1d_hf(prefix: str, in_f: int, out_f: int) -> ShapeTable:
    """HF GPT-2 Conv1D: weight stored transposed as (in, out), then bias (out,)."""
    return [(f"{prefix}.weight", (in_f, out_f)), (f"{prefix}.bias", (out_f,))]


def _conv2d(prefix: str, in_c: int, out_c: int, k: int, bias: bool) -> ShapeTable:
    """nn.Conv2d: weight (out, in, k, k), optional bias (out,)."""
    out: ShapeTable = [(f"{prefix}.weight", (out_c, in_c, k, k))]
    if bias:
        out.append((f"{prefix}.bias", (out_c,)))
    return out


def _norm(prefix: str, n: int) -> ShapeTable:
    """BatchNorm / LayerNorm affine params: weight (n,) then bias (n,); running stats are buffers."""
    return [(f"{prefix}.weight", (n,)), (f"{prefix}.bias", (n,))]


def _embedding(prefix: str, num: int, dim: int) -> ShapeTable:
    """nn.Embedding: weight (num, dim)."""
    return [(f"{prefix}.weight", (num, dim))]


# --------------------------------------------------------------------------
# Published architectures.
# --------------------------------------------------------------------------

def resnet50_shapes(num_classes: int = 1000) -> ShapeTable:
    """torchvision ``resnet50()``: Bottleneck blocks [3, 4, 6, 3], expansion 4, bias-free convs."""
    t: ShapeTable = []
    t += _conv2d("conv1", 3, 64, 7, bias=False)
    t += _norm("bn1", 64)
    in_c = 64
    for li, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512)), start=1):
        out_c = width * 4
        for b in range(blocks):
            p = f"layer{li}.{b}"
            t += _conv2d(f"{p}.conv1", in_c, width, 1, bias=False)
            t += _norm(f"{p}.bn1", width)
            t += _conv2d(f"{p}.conv2", width, width, 3, bias=False)
            t += _norm(f"{p}.bn2", width)
            t += _conv2d(f"{p}.conv3", width, out_c, 1, bias=False)
            t += _norm(f"{p}.bn3", out_c)
            if b == 0:  # first block of every stage changes channels (and/or stride)
                t += _conv2d(f"{p}.downsample.0", in_c, out_c, 1, bias=False)
                t += _norm(f"{p}.downsample.1", out_c)
            in_c = out_c
    t += _linear("fc", 512 * 4, num_classes)
    return t


_VGG16_CFG: tuple[int | str, ...] = (
    64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M",
)


def vgg16_shapes(num_classes: int = 1000) -> ShapeTable:
    """torchvision ``vgg16()`` (no BN): Sequential indices count ReLU/MaxPool/Dropout slots too."""
    t: ShapeTable = []
    idx, in_c = 0, 3
    for v in _VGG16_CFG:
        if v == "M":
            idx += 1  # MaxPool2d
            continue
        assert isinstance(v, int)
        t += _conv2d(f"features.{idx}", in_c, v, 3, bias=True)
        idx += 2  # Conv2d + ReLU
        in_c = v
    # classifier: Linear, ReLU, Dropout, Linear, ReLU, Dropout, Linear
    t += _linear("classifier.0", 512 * 7 * 7, 4096)
    t += _linear("classifier.3", 4096, 4096)
    t += _linear("classifier.6", 4096, num_classes)
    return t


def bert_base_shapes(
    vocab: int = 30522,
    max_pos: int = 512,
    type_vocab: int = 2,
    hidden: int = 768,
    layers: int = 12,
    intermediate: int = 3072,
    pooler: bool = True,
) -> ShapeTable:
    """HF ``BertModel`` (bert-base-uncased defaults); head count does not affect shapes."""
    t: ShapeTable = []
    t += _embedding("embeddings.word_embeddings", vocab, hidden)
    t += _embedding("embeddings.position_embeddings", max_pos, hidden)
    t += _embedding("embeddings.token_type_embeddings", type_vocab, hidden)
    t += _norm("embeddings.LayerNorm", hidden)
    for i in range(layers):
        p = f"encoder.layer.{i}"
        for proj in ("query", "key", "value"):
            t += _linear(f"{p}.attention.self.{proj}", hidden, hidden)
        t += _linear(f"{p}.attention.output.dense", hidden, hidden)
        t += _norm(f"{p}.attention.output.LayerNorm", hidden)
        t += _linear(f"{p}.intermediate.dense", hidden, intermediate)
        t += _linear(f"{p}.output.dense", intermediate, hidden)
        t += _norm(f"{p}.output.LayerNorm", hidden)
    if pooler:
        t += _linear("pooler.dense", hidden, hidden)
    return t


def gpt2_shapes(
    vocab: int = 50257, n_positions: int = 1024, hidden: int = 768, layers: int = 12
) -> ShapeTable:
    """HF ``GPT2Model`` (small): Conv1D weights are (in, out); tied LM head is not a separate param."""
    t: ShapeTable = []
    t += _embedding("wte", vocab, hidden)
    t += _embedding("wpe", n_positions, hidden)
    for i in range(layers):
        p = f"h.{i}"
        t += _norm(f"{p}.ln_1", hidden)
        t += _conv1d_hf(f"{p}.attn.c_attn", hidden, 3 * hidden)
        t += _conv1d_hf(f"{p}.attn.c_proj", hidden, hidden)
        t += _norm(f"{p}.ln_2", hidden)
        t += _conv1d_hf(f"{p}.mlp.c_fc", hidden, 4 * hidden)
        t += _conv1d_hf(f"{p}.mlp.c_proj", 4 * hidden, hidden)
    t += _norm("ln_f", hidden)
    return t


# --------------------------------------------------------------------------
# Small models (also buildable as real torch modules).
# --------------------------------------------------------------------------

#: Layer widths of ``mlp``: 8x8 digit images flattened -> two hidden layers -> 10 classes.
MLP_DIMS: tuple[int, ...] = (64, 2048, 2048, 10)

#: ``tiny`` layers as (name, kind, in, out, bias); deliberately odd sizes to exercise padding.
_TINY_LAYERS: tuple[tuple[str, str, int, int, bool], ...] = (
    ("fc1", "linear", 5, 7, True),
    ("norm", "layernorm", 7, 7, True),
    ("fc2", "linear", 7, 7, False),
    ("head", "linear", 7, 3, True),
)


def mlp_shapes() -> ShapeTable:
    """``fc1``..``fcN`` Linear layers over :data:`MLP_DIMS` (4,349,962 params)."""
    t: ShapeTable = []
    for i, (a, b) in enumerate(zip(MLP_DIMS[:-1], MLP_DIMS[1:]), start=1):
        t += _linear(f"fc{i}", a, b)
    return t


def tiny_shapes() -> ShapeTable:
    """Linear(5,7) -> LayerNorm(7) -> Linear(7,7,no bias) -> Linear(7,3): 7 small 1-D/2-D tensors."""
    t: ShapeTable = []
    for name, kind, a, b, bias in _TINY_LAYERS:
        t += _norm(name, a) if kind == "layernorm" else _linear(name, a, b, bias)
    return t


# --------------------------------------------------------------------------
# Registry and public API.
# --------------------------------------------------------------------------

#: Canonical model name -> zero-arg function returning its shape table in registration order.
MODELS: dict[str, Callable[[], ShapeTable]] = {
    "resnet50": resnet50_shapes,
    "vgg16": vgg16_shapes,
    "bert-base": bert_base_shapes,
    "gpt2": gpt2_shapes,
    "mlp": mlp_shapes,
    "tiny": tiny_shapes,
}

#: Alternate spellings (lower-case, '_' folded to '-') -> canonical name.
ALIASES: dict[str, str] = {
    "bert": "bert-base",
    "bert-base-uncased": "bert-base",
    "gpt-2": "gpt2",
    "resnet-50": "resnet50",
    "vgg-16": "vgg16",
}

#: Models that :func:`build_torch_model` can instantiate.
TORCH_MODELS: tuple[str, ...] = ("mlp", "tiny")


def _resolve(name: str) -> str:
    """Map a case-insensitive name or alias to its canonical key; ValueError if unknown."""
    key = str(name).strip().lower().replace("_", "-")
    key = ALIASES.get(key, key)
    if key not in MODELS:
        raise ValueError(
            f"unknown model {name!r}; known models: {', '.join(MODELS)} "
            f"(aliases: {', '.join(sorted(ALIASES))})"
        )
    return key


def model_names() -> list[str]:
    """Canonical names of all built-in models."""
    return list(MODELS)


def model_shapes(name: str) -> ShapeTable:
    """(param name, shape) pairs in registration order, as ``named_parameters()`` yields them."""
    return list(MODELS[_resolve(name)]())


def model_tensors(name: str) -> ShapeTable:
    """(param name, shape) pairs in backward order (reverse registration): gradient-ready order."""
    return model_shapes(name)[::-1]


def model_num_params(name: str) -> int:
    """Total number of scalar parameters in the model."""
    return sum(math.prod(shape) for _, shape in model_shapes(name))


def build_torch_model(name: str) -> "torch.nn.Module":
    """Instantiate a real ``nn.Module`` for a small model (``mlp``/``tiny``); torch imported lazily."""
    key = _resolve(name)
    if key not in TORCH_MODELS:
        raise ValueError(
            f"model {key!r} is available only as a shape table (see model_shapes); "
            f"build_torch_model supports: {', '.join(TORCH_MODELS)}"
        )
    import torch
    from torch import nn

    if key == "mlp":

        class MLP(nn.Module):
            """Flatten -> (Linear, ReLU)* -> Linear over MLP_DIMS."""

            def __init__(self) -> None:
                super().__init__()
                self.depth = len(MLP_DIMS) - 1
                for i, (a, b) in enumerate(zip(MLP_DIMS[:-1], MLP_DIMS[1:]), start=1):
                    setattr(self, f"fc{i}", nn.Linear(a, b))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                x = x.flatten(1)
                for i in range(1, self.depth + 1):
                    x = getattr(self, f"fc{i}")(x)
                    if i < self.depth:
                        x = torch.relu(x)
                return x

        return MLP()

    class Tiny(nn.Module):
        """Toy network matching ``tiny_shapes()``: input (N, 5) -> logits (N, 3)."""

        def __init__(self) -> None:
            super().__init__()
            for lname, kind, a, b, bias in _TINY_LAYERS:
                mod = nn.LayerNorm(a) if kind == "layernorm" else nn.Linear(a, b, bias=bias)
                setattr(self, lname, mod)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.relu(self.fc1(x))
            x = self.norm(x)
            x = torch.relu(self.fc2(x))
            return self.head(x)

    return Tiny()
