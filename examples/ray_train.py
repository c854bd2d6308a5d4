"""Ray Train's TorchTrainer with casync's DDP comm hook on the prepared model, checkpoints through ray.train.

    python examples/ray_train.py --workers 2 --codec onebit --epochs 3
    python examples/ray_train.py --workers 2 --codec onebit --epochs 3 --resume <a checkpoint path it printed>

A Ray Train script as Ray's guides write it (``TorchTrainer`` + ``ScalingConfig``, ``prepare_model`` wraps the
model in DDP, ``ray.train.report`` saves a checkpoint per epoch); casync adds three lines: a ``CasyncState``,
``register_comm_hook`` on the prepared model, and its ``state_dict()`` in the checkpoint (collective: every
worker calls it, rank 0 writes the file).  A run resumed from a checkpoint continues bit for bit: the final
``crc`` of a straight 3-epoch run equals that of a run resumed from its epoch-2 checkpoint.

Needs Ray Train (``pip install -e ".[ray-train]"``, included in ``.[dev]``).  ``--address`` joins a running Ray
cluster; by default an embedded local Ray is started.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import zlib
from typing import Any

import torch

import casync.torch  # casync


def make_data(rank: int, n: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    centers = torch.randn(10, 64, generator=torch.Generator().manual_seed(0)) * 0.25
    g = torch.Generator().manual_seed(1 + rank)
    labels = torch.randint(0, 10, (n,), generator=g)
    return centers[labels] + torch.randn(n, 64, generator=g), labels


def train_loop(config: dict[str, Any]) -> None:
    """What every Ray Train worker runs (torch.distributed is set up by Ray Train: gloo on CPUs)."""
    import ray.train
    from ray.train.torch import prepare_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    rank = ray.train.get_context().get_world_rank()
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    model = prepare_model(model, parallel_strategy_kwargs={"bucket_cap_mb": 0.1})  # DDP
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    state = casync.torch.CasyncState(strategy=config["strategy"], codec=config["codec"])  # casync
    start = 0
    checkpoint = ray.train.Checkpoint(config["resume"]) if config.get("resume") else ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            saved = torch.load(os.path.join(folder, "checkpoint.pt"), weights_only=True)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state.load_state_dict(saved["casync"])  # casync: the plan, the step, every worker's residuals
        start = saved["epoch"]
    model.register_comm_hook(state, casync.torch.comm_hook)  # casync

    x, y = make_data(rank)
    for epoch in range(start, config["epochs"]):
        for step in range(config["steps"]):
            index = torch.randint(0, len(x), (64,), generator=torch.Generator().manual_seed(
                (epoch * 1000 + step) * 100 + rank))
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[index]), y[index])
            loss.backward()
            optimizer.step()
        crc = 0
        for p in model.parameters():
            crc = zlib.crc32(p.detach().cpu().numpy().tobytes(), crc)
        metrics = {"epoch": epoch + 1, "loss": loss.item(), "crc": f"{crc:08x}",
                   "sent_bytes": state.session.stats.get("sent_bytes", 0) if state.session else 0}
        casync_state = state.state_dict()  # casync: collective, so every worker calls it
        with tempfile.TemporaryDirectory() as folder:
            if rank == 0:
                torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                            "casync": casync_state, "epoch": epoch + 1}, os.path.join(folder, "checkpoint.pt"))
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))
            else:
                ray.train.report(metrics)


def _absolute(path: str | None) -> str | None:
    """A local path made absolute (URIs such as ``s3://...`` as given)."""
    return path if not path or "://" in path else os.path.abspath(path)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--strategy", default="ring")
    p.add_argument("--codec", default="onebit")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=20, help="steps per epoch")
    p.add_argument("--resume", default=None, help="a checkpoint directory of an earlier run")
    p.add_argument("--storage", default=None, help="where Ray Train keeps runs (default: a temporary directory)")
    p.add_argument("--address", default=None, help="a Ray cluster to join (default: an embedded local Ray)")
    args = p.parse_args(argv)
    # Ray Train reads these as URIs (pyarrow): a relative local path would fail inside the workers
    resume, storage = (_absolute(x) for x in (args.resume, args.storage))

    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from casync.runtime.ray_layer import connect_ray

    # joins --address, or reuses a Ray this process started, or starts one bound to 127.0.0.1 (docs/cluster.md)
    connect_ray(args.address, num_cpus=None if args.address else max(4, args.workers + 1))
    storage = storage or tempfile.mkdtemp(prefix="casync-ray-train-")
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"strategy": args.strategy, "codec": args.codec, "epochs": args.epochs,
                           "steps": args.steps, "resume": resume},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False),
        run_config=RunConfig(storage_path=storage, name="casync_ray_train"),
    )
    result = trainer.fit()
    metrics = dict(result.metrics or {})
    path = result.checkpoint.path if result.checkpoint else None
    print(f"done: {args.workers} workers, {args.strategy}/{args.codec}; epoch {metrics.get('epoch')}, "
          f"loss {metrics.get('loss', float('nan')):.4f}, crc {metrics.get('crc')}, bytes sent per step by rank 0 "
          f"{metrics.get('sent_bytes')}; checkpoint {path}", flush=True)
    for checkpoint, m in getattr(result, "best_checkpoints", None) or []:
        print(f"checkpoint of epoch {m.get('epoch')}: {checkpoint.path} crc {m.get('crc')}", flush=True)
    return {"metrics": metrics, "checkpoint": path}


if __name__ == "__main__":
    main()
