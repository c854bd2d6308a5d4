"""The training tasks on small data made here: seeded models, losses that fall when trained, metrics in range,
each rank its own batches, and a clear error for a task that does not exist."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from casync.tasks import available_tasks, get_task
from tests.datasets.test_idx_images import write_idx
from tests.datasets.test_pycorpus import make_tree


def test_an_unknown_task_names_the_known_ones():
    assert available_tasks() == ["image", "lm"]
    with pytest.raises(ValueError, match="unknown task 'speech'; choose one of image, lm"):
        get_task("speech")


def train_a_little(task, data, steps=8):
    model = task.model(data, seed=3)
    twin = task.model(data, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), twin.state_dict().values()))
    opt = task.optimizer(model.parameters(), task.defaults["lr"])
    x, y = next(task.batches(data, rank=0, world=1, batch_size=4))
    losses = []
    for _ in range(steps):  # one batch again and again: its loss falls
        opt.zero_grad()
        loss = task.loss(model, x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert np.isfinite(losses).all() and losses[-1] < losses[0], losses
    return model


def test_the_language_model_is_embedding_heavy_learns_and_is_judged_by_validation_loss(tmp_path):
    from casync.tasks import lm

    task = get_task("lm")
    data = task.load(make_tree(tmp_path, files=40))
    model = train_a_little(task, data)
    vocab = len(data.vocab)
    assert model.embedding.weight.shape == (vocab, lm.EMBED) and model.decoder.weight.shape == (vocab, lm.WIDTH)
    assert model.decoder.weight is not model.embedding.weight
    value = task.evaluate(model, data)
    assert np.isfinite(value) and value > 0 and not task.higher_is_better


def make_images(folder, train=64, test=20):
    rng = np.random.default_rng(1)
    for stem, n in (("train", train), ("t10k", test)):
        labels = rng.integers(0, 10, n).astype(np.uint8)
        images = (rng.integers(0, 50, (n, 28, 28)) + labels[:, None, None] * 20).astype(np.uint8)  # learnable
        write_idx(folder / f"{stem}-images-idx3-ubyte.gz", images)
        write_idx(folder / f"{stem}-labels-idx1-ubyte.gz", labels)
    return folder


def test_the_image_model_learns_and_each_rank_gets_its_own_images(tmp_path):
    task = get_task("image")
    data = task.load(make_images(tmp_path))
    model = train_a_little(task, data)
    accuracy = task.evaluate(model, data)
    assert 0.0 <= accuracy <= 1.0 and task.higher_is_better
    seen = [torch.cat([x for x, _ in itertools.islice(task.batches(data, rank, 2, batch_size=8), 4)])
            for rank in range(2)]
    flat = {tuple(img.flatten().tolist()) for imgs in seen for img in imgs}
    assert len(flat) == 64  # one epoch: 32 images per rank, none seen by both
