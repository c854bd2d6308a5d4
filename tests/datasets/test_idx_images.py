"""IDX image sets: the format read back exactly from files written here, clear errors for what is missing or
corrupt, and Fashion-MNIST from Debian's package where it is installed."""
from __future__ import annotations

import gzip

import numpy as np
import pytest

from casync.datasets.idx_images import FASHION_MNIST, FILES, load_images, read_idx


def write_idx(path, array, zipped=True):
    codes = {np.dtype(np.uint8): 0x08, np.dtype(">i4"): 0x0C}
    header = bytes([0, 0, codes[array.dtype], array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    data = header + array.tobytes()
    path.write_bytes(gzip.compress(data) if zipped else data)


def make_set(folder, train=30, test=10, zipped=True):
    rng = np.random.default_rng(0)
    arrays = {"train_images": rng.integers(0, 256, (train, 5, 4), dtype=np.uint8),
              "train_labels": rng.integers(0, 3, train).astype(np.uint8),
              "test_images": rng.integers(0, 256, (test, 5, 4), dtype=np.uint8),
              "test_labels": rng.integers(0, 3, test).astype(np.uint8)}
    for key, array in arrays.items():
        write_idx(folder / (FILES[key] + (".gz" if zipped else "")), array, zipped)
    return arrays


@pytest.mark.parametrize("zipped", [True, False])
def test_a_set_written_here_reads_back_exactly(tmp_path, zipped):
    arrays = make_set(tmp_path, zipped=zipped)
    images = load_images(tmp_path)
    assert np.array_equal(images.x_train, arrays["train_images"])
    assert np.array_equal(images.x_test, arrays["test_images"])
    assert images.y_train.dtype == np.int64 and np.array_equal(images.y_train, arrays["train_labels"])
    assert images.manifest["train"] == 30 and images.manifest["shape"] == [5, 4] and images.classes <= 3
    big = np.arange(6, dtype=">i4").reshape(2, 3)
    write_idx(tmp_path / "big.idx", big, zipped=False)
    assert np.array_equal(read_idx(tmp_path / "big.idx"), big) and read_idx(tmp_path / "big.idx").dtype == np.int32


def test_what_is_missing_or_corrupt_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_images(tmp_path / "nope")
    make_set(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError, match="no t10k-labels-idx1-ubyte"):
        load_images(tmp_path)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.zeros(9, np.uint8))  # 9 labels for 10 images
    with pytest.raises(ValueError, match="test images .* do not match"):
        load_images(tmp_path)
    (tmp_path / "junk").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(tmp_path / "junk")


@pytest.mark.skipif(not FASHION_MNIST.is_dir(), reason="Debian's dataset-fashion-mnist is not installed here")
def test_fashion_mnist_from_debians_package():
    images = load_images()
    assert (len(images.x_train), len(images.x_test), images.x_train.shape[1:], images.classes) == (60000, 10000,
                                                                                                   (28, 28), 10)
    assert np.bincount(images.y_test).tolist() == [1000] * 10
