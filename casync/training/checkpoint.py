"""Trainer checkpoints: a directory of JSON, ``torch.save``d state dicts and one ``.npz`` — no pickles.

::

    trainer.json   format/version, step, configuration, parameter hash, per-worker RNG states and data
                   positions, and the index of the arrays below
    model.pt       the model's state dict (identical on every worker)
    optimizer.pt   the optimizer's state dict (identical on every worker: same parameters, same gradients)
    arrays.npz     error-feedback residuals of every actor, per-worker momentum-correction buffers, and the
                   synchronized gradients of a delayed update not yet applied (with, per worker, its NaN/Inf
                   reports in trainer.json and the momentum buffers from before it, to void it)

A save goes to a temporary directory that then replaces ``path``, so a crash mid-save never leaves a
half-written checkpoint where a good one was.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .plain import to_numpy_tree, to_torch_tree

FORMAT = "casync.Trainer checkpoint"
VERSION = 1


@dataclass
class Checkpoint:
    """A checkpoint read back: what ``Trainer.load`` restores."""

    step: int
    config: dict[str, Any]
    param_hash: int
    model: dict[str, np.ndarray]
    optimizer: dict[str, Any]
    residuals: dict[str, np.ndarray]
    workers: list[dict[str, Any]]  # per rank: rng, data, momentum, pending_nonfinite, pending_momentum
    pending_step: int | None
    pending_results: dict[str, np.ndarray] | None


def write_checkpoint(path: str | Path, *, step: int, config: dict[str, Any], param_hash: int,
                     states: list[dict[str, Any]], residuals: dict[str, np.ndarray]) -> Path:
    """Write ``states`` (one ``TrainWorker.export_state`` per rank, rank 0 with the model) to ``path``."""
    path = Path(path)
    arrays: dict[str, np.ndarray] = {}

    def put(value: np.ndarray) -> str:
        key = f"a{len(arrays)}"
        arrays[key] = np.asarray(value)
        return key

    first = states[0]
    pending = first.get("pending_results")
    index = {
        "residuals": {k: put(v) for k, v in sorted(residuals.items())},
        "momentum": [{n: put(v) for n, v in s["momentum"].items()} for s in states],
        "pending": None if pending is None else {"step": first["pending_step"],
                                                 "results": {b: put(v) for b, v in pending.items()}},
        # per worker: momentum-correction buffers from before the pending step (to void it), or None
        "pending_momentum": [None if s.get("pending_momentum") is None
                             else {n: put(v) for n, v in s["pending_momentum"].items()} for s in states],
    }
    meta = {
        "format": FORMAT, "version": VERSION, "step": step, "config": config, "param_hash": param_hash,
        "workers": [{"rank": s["rank"], "rng": s["rng"], "data": s["data"],
                     "pending_nonfinite": s.get("pending_nonfinite", [])} for s in states], "arrays": index,
    }
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    np.savez(tmp / "arrays.npz", **arrays)
    torch.save(to_torch_tree(first["model"]), tmp / "model.pt")
    torch.save(to_torch_tree(first["optimizer"]), tmp / "optimizer.pt")
    (tmp / "trainer.json").write_text(json.dumps(meta) + "\n")
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    if old.exists():
        shutil.rmtree(old)
    return path


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Read and check a checkpoint directory written by :func:`write_checkpoint`."""
    path = Path(path)
    meta_path = path / "trainer.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{path} is not a Trainer checkpoint (no trainer.json)")
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{meta_path}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{meta_path}: not a casync Trainer checkpoint")
    if meta.get("version") != VERSION:
        raise ValueError(f"{meta_path}: checkpoint version {meta.get('version')!r} is not supported "
                         f"(expected {VERSION})")
    try:
        return _parse(path, meta)
    except (KeyError, TypeError, ValueError, IndexError, OSError, RuntimeError, EOFError,
            pickle.UnpicklingError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path}: corrupted Trainer checkpoint ({type(exc).__name__}: {exc})"[:400]) from exc


def _parse(path: Path, meta: dict[str, Any]) -> Checkpoint:
    """The checkpoint's arrays and state dicts, as ``meta`` (trainer.json) indexes them."""
    with np.load(path / "arrays.npz", allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    index = meta["arrays"]

    def get(key: str) -> np.ndarray:
        if key not in arrays:
            raise ValueError(f"{path / 'arrays.npz'} lacks array {key!r} listed in trainer.json")
        return arrays[key]

    workers = []
    pending_momentum = index.get("pending_momentum") or [None] * len(meta["workers"])
    for entry, momentum, before in zip(meta["workers"], index["momentum"], pending_momentum):
        workers.append(dict(entry, momentum={n: get(k) for n, k in momentum.items()},
                            pending_momentum=None if before is None else {n: get(k) for n, k in before.items()}))
    pending = index["pending"]
    model = to_numpy_tree(torch.load(path / "model.pt", weights_only=True))
    optimizer = to_numpy_tree(torch.load(path / "optimizer.pt", weights_only=True))
    return Checkpoint(step=int(meta["step"]), config=meta["config"], param_hash=int(meta["param_hash"]),
                      model=model, optimizer=optimizer,
                      residuals={k: get(v) for k, v in index["residuals"].items()}, workers=workers,
                      pending_step=None if pending is None else int(pending["step"]),
                      pending_results=None if pending is None else {b: get(k) for b, k in pending["results"].items()})
