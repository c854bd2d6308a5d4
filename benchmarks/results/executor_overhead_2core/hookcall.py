"""The autograd thread's time in casync's comm hook calls before the last bucket, per iteration: 2 gloo ranks on this
machine, ResNet-50's gradient shapes, ring/onebit, 25 MiB DDP buckets; ROOT= the checkout to time (default: this one)."""
import os, sys, time, statistics, datetime
import torch, torch.distributed as dist, torch.multiprocessing as mp
sys.path.insert(0, os.environ.get("ROOT", os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))

def main(rank, world):
    from casync.engines.memory import keep_freed_memory
    keep_freed_memory()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29611", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    from casync.bench.baselines import _gradient_model
    from casync.bench.hooks import casync_hook
    from casync.plan.models import model_shapes
    import numpy as np, math
    shapes = model_shapes("resnet50")
    flat = torch.from_numpy(np.random.default_rng(rank).standard_normal(sum(math.prod(s) for _, s in shapes)).astype(np.float32))
    views, off = [], 0
    for _, s in shapes:
        n = math.prod(s); views.append((off, off + n, s)); off += n
    grads = [flat[a:b].view(s) for a, b, s in reversed(views)]
    model = _gradient_model(shapes)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25, gradient_as_bucket_view=True)
    state, hook = casync_hook(os.environ.get("VARIANT", "ddp-casync:ring:onebit"))
    calls = []
    def timed(st, bucket):
        t = time.perf_counter(); f = hook(st, bucket)
        if not bucket.is_last(): calls.append(time.perf_counter() - t)
        return f
    ddp.register_comm_hook(state, timed)
    for i in range(25):
        if i == 15: calls.clear()
        ddp.zero_grad(set_to_none=False)
        ddp(grads).backward()
    if rank == 0:
        per = len(calls) // 10
        sums = [sum(calls[i*per:(i+1)*per]) for i in range(10)]
        print(f"hook calls before the last bucket, per iteration: median {1e3*statistics.median(sums):.2f} ms ({per} calls; each median {1e6*statistics.median(calls):.0f} us)")
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(main, args=(2,), nprocs=2)
