"""Image classification sets in the IDX format (MNIST's), read offline from a folder a registry package installs.

Fashion-MNIST (60,000 training and 10,000 test images of clothing, 28x28 grey levels, 10 classes) ships in Debian's
``dataset-fashion-mnist`` package (``apt-get install dataset-fashion-mnist``: 30 MB, into
:data:`FASHION_MNIST`).  It was chosen over every PyPI package found that names MNIST or CIFAR: those download
their data at run time, where this one carries it.  Small models do not reach its ceiling (about 90 % for a
small convolutional network), so a codec's cost in accuracy shows.  Any folder holding the four files
``{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]`` works (MNIST itself, KMNIST).
"""
from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
FILES = {"train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
         "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}
_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"),
           0x0E: np.dtype(">f8")}


def read_idx(path: str | Path) -> np.ndarray:
    """One IDX file (gzipped or not) as an array of its shape and type."""
    path = Path(path)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _DTYPES:
        raise ValueError(f"{path}: not an IDX file (its magic number is {raw[:4].hex()!r})")
    dims = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    dtype = np.dtype(_DTYPES[raw[2]])
    body = raw[4 + 4 * dims:]
    if len(body) != int(np.prod(shape)) * dtype.itemsize:
        raise ValueError(f"{path}: header says {shape} x {dtype.itemsize} bytes, the file holds {len(body)}")
    return np.frombuffer(body, dtype).reshape(shape).astype(dtype.newbyteorder("="))


@dataclass(frozen=True)
class ImageSet:
    """Training and test images (uint8, N x H x W), their labels (int64) and where they came from."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    manifest: dict[str, Any]

    @property
    def classes(self) -> int:
        return int(max(self.y_train.max(), self.y_test.max())) + 1


def load_images(folder: str | Path = FASHION_MNIST) -> ImageSet:
    """The four IDX files in ``folder`` (default: Fashion-MNIST from Debian's package), checked for agreement."""
    base = Path(folder)
    if not base.is_dir():
        hint = " (install it: apt-get install dataset-fashion-mnist)" if base == FASHION_MNIST else ""
        raise FileNotFoundError(f"image folder {str(base)!r} does not exist{hint}")
    arrays, digest = {}, hashlib.sha256()
    for key, stem in FILES.items():
        found = [p for p in (base / f"{stem}.gz", base / stem) if p.is_file()]
        if not found:
            raise FileNotFoundError(f"image folder {str(base)!r} has no {stem}[.gz]")
        digest.update(found[0].read_bytes())
        arrays[key] = read_idx(found[0])
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise ValueError(f"{base}: {split} images {images.shape} and labels {labels.shape} do not match")
    info = {"folder": str(base), "sha256": digest.hexdigest(), "train": len(arrays["train_labels"]),
            "test": len(arrays["test_labels"]), "shape": list(arrays["train_images"].shape[1:])}
    return ImageSet(arrays["train_images"], arrays["train_labels"].astype(np.int64), arrays["test_images"],
                    arrays["test_labels"].astype(np.int64), info)
