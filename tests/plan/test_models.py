"""Tests for casync.models: exact published parameter counts, ordering, aliases, torch builds."""

from __future__ import annotations

import math

import pytest

from casync.plan.models import (
    MODELS,
    build_torch_model,
    model_names,
    model_num_params,
    model_shapes,
    model_tensors,
)

# name -> (total params, number of tensors); big ones match torchvision / HF exactly.
EXPECTED: dict[str, tuple[int, int]] = {
    "resnet50": (25_557_032, 161),
    "vgg16": (138_357_544, 32),
    "bert-base": (109_482_240, 199),  # 5 embedding + 12 * 16 layer + 2 pooler tensors
    "gpt2": (124_439_808, 148),  # 2 embedding + 12 * 12 block + 2 ln_f tensors
    "mlp": (4_349_962, 6),  # 64*2048+2048 + 2048*2048+2048 + 2048*10+10
    "tiny": (129, 7),
}


def test_registry_contents() -> None:
    """Every documented model is registered, and nothing undocumented."""
    assert set(model_names()) == set(EXPECTED)
    assert model_names() == list(MODELS)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_counts(name: str) -> None:
    """Exact parameter and tensor counts."""
    params, tensors = EXPECTED[name]
    shapes = model_shapes(name)
    assert len(shapes) == tensors
    assert model_num_params(name) == params
    assert sum(math.prod(s) for _, s in shapes) == params


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_table_well_formed(name: str) -> None:
    """Names unique, shapes are non-empty tuples of positive ints (no 0-d tensors)."""
    shapes = model_shapes(name)
    names = [n for n, _ in shapes]
    assert len(set(names)) == len(names)
    for n, s in shapes:
        assert isinstance(n, str) and n
        assert isinstance(s, tuple) and len(s) >= 1
        assert all(isinstance(d, int) and d > 0 for d in s)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_backward_order_is_reverse(name: str) -> None:
    """model_tensors is the exact reverse of model_shapes (gradient-ready order)."""
    assert model_tensors(name) == list(reversed(model_shapes(name)))


def test_model_shapes_returns_fresh_list() -> None:
    """Mutating a returned table must not corrupt later calls."""
    a = model_shapes("tiny")
    a.clear()
    assert len(model_shapes("tiny")) == EXPECTED["tiny"][1]


@pytest.mark.parametrize(
    "name, shape",
    [
        ("conv1.weight", (64, 3, 7, 7)),
        ("bn1.weight", (64,)),
        ("layer1.0.downsample.0.weight", (256, 64, 1, 1)),
        ("layer2.0.conv2.weight", (128, 128, 3, 3)),
        ("layer4.2.conv3.weight", (2048, 512, 1, 1)),
        ("fc.weight", (1000, 2048)),
        ("fc.bias", (1000,)),
    ],
)
def test_resnet50_spot_shapes(name: str, shape: tuple[int, ...]) -> None:
    """Known torchvision ResNet-50 shapes."""
    assert dict(model_shapes("resnet50"))[name] == shape


def test_resnet50_order_and_downsample() -> None:
    """Registration order starts at the stem, ends at fc; only block 0 of each stage downsamples."""
    names = [n for n, _ in model_shapes("resnet50")]
    assert names[:3] == ["conv1.weight", "bn1.weight", "bn1.bias"]
    assert names[-2:] == ["fc.weight", "fc.bias"]
    ds = sorted({n.split(".downsample")[0] for n in names if ".downsample." in n})
    assert ds == ["layer1.0", "layer2.0", "layer3.0", "layer4.0"]
    assert not any(n.startswith("conv") and n.endswith(".bias") for n in names)


def test_vgg16_spot_shapes() -> None:
    """Known torchvision VGG-16 names (Sequential indices) and shapes."""
    d = dict(model_shapes("vgg16"))
    assert d["features.0.weight"] == (64, 3, 3, 3)
    assert d["features.28.weight"] == (512, 512, 3, 3)
    assert d["classifier.0.weight"] == (4096, 25088)
    assert d["classifier.6.bias"] == (1000,)
    names = [n for n, _ in model_shapes("vgg16")]
    assert names[0] == "features.0.weight" and names[-1] == "classifier.6.bias"
    conv_idx = sorted({int(n.split(".")[1]) for n in names if n.startswith("features.")})
    assert conv_idx == [0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28]


def test_bert_spot_shapes() -> None:
    """Known HF BertModel names and shapes."""
    d = dict(model_shapes("bert-base"))
    assert d["embeddings.word_embeddings.weight"] == (30522, 768)
    assert d["embeddings.position_embeddings.weight"] == (512, 768)
    assert d["embeddings.token_type_embeddings.weight"] == (2, 768)
    assert d["encoder.layer.0.attention.self.query.weight"] == (768, 768)
    assert d["encoder.layer.11.intermediate.dense.weight"] == (3072, 768)
    assert d["encoder.layer.11.output.dense.weight"] == (768, 3072)
    assert d["pooler.dense.weight"] == (768, 768)
    names = [n for n, _ in model_shapes("bert-base")]
    assert names[0] == "embeddings.word_embeddings.weight"
    assert names[-1] == "pooler.dense.bias"


def test_gpt2_spot_shapes() -> None:
    """Known HF GPT2Model names and Conv1D (in, out) shapes; no lm_head."""
    d = dict(model_shapes("gpt2"))
    assert d["wte.weight"] == (50257, 768)
    assert d["wpe.weight"] == (1024, 768)
    assert d["h.0.attn.c_attn.weight"] == (768, 2304)
    assert d["h.0.attn.c_attn.bias"] == (2304,)
    assert d["h.11.mlp.c_fc.weight"] == (768, 3072)
    assert d["h.11.mlp.c_proj.weight"] == (3072, 768)
    assert d["ln_f.weight"] == (768,)
    assert not any("lm_head" in n for n in d)
    names = [n for n, _ in model_shapes("gpt2")]
    assert names[:2] == ["wte.weight", "wpe.weight"]
    assert names[-2:] == ["ln_f.weight", "ln_f.bias"]


@pytest.mark.parametrize(
    "alias, canonical",
    [
        ("bert", "bert-base"),
        ("BERT", "bert-base"),
        ("bert_base", "bert-base"),
        ("bert-base-uncased", "bert-base"),
        ("gpt-2", "gpt2"),
        ("GPT2", "gpt2"),
        ("resnet-50", "resnet50"),
        ("ResNet50", "resnet50"),
        ("vgg-16", "vgg16"),
        ("VGG16", "vgg16"),
        ("MLP", "mlp"),
    ],
)
def test_aliases(alias: str, canonical: str) -> None:
    """Aliases and case variants resolve to the canonical model."""
    assert model_shapes(alias) == model_shapes(canonical)
    assert model_num_params(alias) == model_num_params(canonical)


def test_unknown_name_lists_known() -> None:
    """Unknown names raise ValueError naming the available models."""
    with pytest.raises(ValueError) as exc:
        model_shapes("resnet18")
    msg = str(exc.value)
    assert "resnet18" in msg
    for name in EXPECTED:
        assert name in msg
    with pytest.raises(ValueError):
        model_tensors("nope")
    with pytest.raises(ValueError):
        model_num_params("nope")


@pytest.mark.parametrize("name", ["resnet50", "vgg16", "bert-base", "gpt2", "bert"])
def test_build_torch_model_rejects_big(name: str) -> None:
    """Published architectures are shape tables only."""
    with pytest.raises(ValueError, match="shape table"):
        build_torch_model(name)


def test_build_torch_model_rejects_unknown() -> None:
    """Unknown names fail the same way as elsewhere."""
    with pytest.raises(ValueError, match="known models"):
        build_torch_model("nope")


@pytest.mark.parametrize("name", ["mlp", "tiny"])
def test_build_torch_model_matches_table(name: str) -> None:
    """Real modules' named_parameters() equal the shape table, in order, and run forward/backward."""
    torch = pytest.importorskip("torch")
    model = build_torch_model(name)
    got = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert got == model_shapes(name)
    assert sum(p.numel() for p in model.parameters()) == EXPECTED[name][0]

    in_dim = 64 if name == "mlp" else 5
    out_dim = 10 if name == "mlp" else 3
    y = model(torch.randn(4, in_dim))
    assert tuple(y.shape) == (4, out_dim)
    y.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_mlp_accepts_8x8_images() -> None:
    """mlp flattens 8x8 digit images."""
    torch = pytest.importorskip("torch")
    assert tuple(build_torch_model("mlp")(torch.randn(2, 8, 8)).shape) == (2, 10)
