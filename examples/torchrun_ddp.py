"""An ordinary DDP training script, with casync's gradient compression added by registering one comm hook.

    torchrun --nproc-per-node 4 examples/torchrun_ddp.py --codec onebit
    torchrun --nproc-per-node 4 examples/torchrun_ddp.py --codec topk:ratio=0.01 --strategy allgather
    torchrun --nnodes 2 --nproc-per-node 4 ... examples/torchrun_ddp.py --strategy auto --codec auto --gbps 10
    torchrun --nproc-per-node 2 examples/torchrun_ddp.py --steps 60 --checkpoint ckpt.pt --save-at 30
    torchrun --nproc-per-node 2 examples/torchrun_ddp.py --steps 60 --checkpoint ckpt.pt --resume   # continues exactly

The task is a synthetic 10-class problem (Gaussian clusters in 64 dimensions) for a small MLP, so the script
needs nothing but torch.  Every rank draws its own batches; DDP averages the gradients through casync's plan.
Lines marked ``# casync`` are all it takes (the rest is a plain DDP script); ``--codec none`` syncs exactly.
"""
from __future__ import annotations

import argparse
import os
import time
import zlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import casync.torch  # casync


def make_data(seed: int, n: int = 4096, dim: int = 64, classes: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, dim, generator=torch.Generator().manual_seed(0)) * 0.25
    labels = torch.randint(0, classes, (n,), generator=g)
    return centers[labels] + torch.randn(n, dim, generator=g), labels


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 10))


def checksum(model: torch.nn.Module) -> str:
    crc = 0
    for p in model.parameters():
        crc = zlib.crc32(p.detach().cpu().contiguous().numpy().tobytes(), crc)
    return f"{crc:08x}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--strategy", default="ring", help="ring | ps | allgather | auto")
    p.add_argument("--gbps", type=float, default=10.0, help="with --strategy auto: the links between nodes")
    p.add_argument("--nodes", type=int, default=None,
                   help="with --strategy auto: the nodes the ranks are spread over (default: WORLD_SIZE / "
                        "LOCAL_WORLD_SIZE, from torchrun)")
    p.add_argument("--codec", default="onebit", help="none | fp16 | onebit | topk:ratio=0.01 | ...")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--start-iter", type=int, default=0, help="uncompressed iterations first (as PowerSGD's)")
    p.add_argument("--checkpoint", default=None, help="file for model, optimizer and casync state")
    p.add_argument("--save-at", type=int, default=None, help="save the checkpoint after this many steps")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    args = p.parse_args()

    # one GPU per process where there are enough (NCCL refuses two ranks on one GPU); else CPU and gloo
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    dist.init_process_group("nccl" if use_cuda else "gloo")  # torchrun's environment
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if use_cuda else torch.device("cpu")
    torch.manual_seed(0)  # the same initial model on every rank
    torch.set_num_threads(1)
    model = DDP(make_model().to(device), bucket_cap_mb=0.25)  # a few buckets, so sync overlaps backward
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    plan_for = {}
    if args.strategy == "auto":  # the planner chooses per DDP bucket, for this cluster and DDP's timing
        nodes = args.nodes or max(1, world // int(os.environ.get("LOCAL_WORLD_SIZE", world)))
        plan_for["cluster"] = casync.ClusterModel(nodes=nodes, workers_per_node=-(-world // nodes),
                                                  bandwidth_gbps=args.gbps)
    state = casync.torch.CasyncState(strategy=args.strategy, codec=args.codec,  # casync
                                     start_iter=args.start_iter, **plan_for)
    start = 0
    if args.resume:
        ckpt = torch.load(args.checkpoint, map_location=device, weights_only=True)
        model.module.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        state.load_state_dict(ckpt["casync"])  # casync: residuals, step, the plan
        start = ckpt["step"]
    model.register_comm_hook(state, casync.torch.comm_hook)  # casync

    x, y = make_data(seed=1 + rank)
    x, y = x.to(device), y.to(device)
    begin = time.perf_counter()
    loss = None  # stays None when the checkpoint is already at --steps: nothing left to train
    for step in range(start, args.steps):
        index = torch.randint(0, len(x), (args.batch,), generator=torch.Generator().manual_seed(step * 1000 + rank))
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[index.to(device)]), y[index.to(device)])
        loss.backward()
        optimizer.step()
        if rank == 0 and (step % 20 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss.item():.4f}", flush=True)
        if args.checkpoint and step + 1 == args.save_at:
            casync_state = state.state_dict()  # casync: collective (every rank's residuals), save it from one
            if rank == 0:
                torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                            "casync": casync_state, "step": step + 1}, args.checkpoint)
                print(f"saved {args.checkpoint} after step {step + 1}", flush=True)
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    if rank == 0:
        if args.strategy == "auto" and state.plan is not None:
            print(state.plan.summary(), flush=True)  # what the planner chose per bucket, and why
        stats = state.session.stats if state.session else {}
        last = "none" if loss is None else f"{loss.item():.4f}"
        print(f"done: {world} ranks, {args.strategy}/{args.codec}, {max(args.steps - start, 0)} steps in "
              f"{time.perf_counter() - begin:.1f}s; last loss {last}, accuracy {accuracy:.3f}; "
              f"bytes sent per step by rank 0: {stats.get('sent_bytes', 0):,} of {stats.get('raw_bytes', 0):,} raw; "
              f"parameters crc {checksum(model.module)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
