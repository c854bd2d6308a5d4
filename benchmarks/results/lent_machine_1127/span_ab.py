"""Median step span and op CPU per actor of RayEngine on this machine, for configs given as strategy/codec."""
import sys, statistics, collections, json
import ray
from casync.bench.predict import make_plan
from casync.bench.measure import measure_plan, step_span
from casync.runtime.gradients import GradientStore
from casync.sim.costmodel import ClusterModel
cfgs = sys.argv[1].split(",")
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 1
iters = int(sys.argv[3]) if len(sys.argv) > 3 else 7
import os; ray.init(num_cpus=os.cpu_count(), include_dashboard=False, object_store_memory=1_500_000_000, log_to_driver=False)
store = GradientStore("resnet50")
out = {}
for cfg in cfgs:
    strategy, codec = cfg.split("/")
    plan = make_plan("resnet50", 4, strategy, codec, (codec,), ClusterModel(nodes=1, workers_per_node=4))
    run = measure_plan(plan, store, None, address=None, iters=iters, transport="direct", compute_threads=threads)
    cpu = collections.defaultdict(float)
    for r in run.timeline:
        if r.get("cpu"):
            cpu[(r["actor"], r["op"])] += r["cpu"]
    per_actor = collections.defaultdict(float)
    for (a, op), v in cpu.items():
        per_actor[a] += v
    byop = collections.defaultdict(float)
    for (a, op), v in cpu.items():
        byop[op] += v / len(per_actor)
    print({k: round(v * 1e3, 1) for k, v in sorted(byop.items())})
    enc = statistics.mean(v for (a, op), v in cpu.items() if op == "encode")
    print(json.dumps(dict(cfg=cfg, span_ms=round(run.sync_median_s * 1e3, 1), spans=[round(s*1e3,1) for s in run.sync_s],
                          op_cpu_ms=round(statistics.mean(per_actor.values()) * 1e3, 1), encode_cpu_ms=round(enc * 1e3, 1),
                          consistent=run.consistent)), flush=True)
