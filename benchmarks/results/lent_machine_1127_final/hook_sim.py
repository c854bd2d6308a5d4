"""What the simulator says the hook's span should be on the lent machine: the ring/onebit plan on DDP-like 25 MiB
buckets, gradients handed over through a backward of F seconds, op costs x4.5, 4 nodes, 10 Gbit, 4 lanes."""
import copy, sys
import casync
from casync.sim.costmodel import ClusterModel, Profile, LinearCost
from casync.plan.ready import backward_ready_times
def scaled(p, f):
    p = copy.deepcopy(p)
    for c, e in p.codecs.items():
        for k, v in list(e.items()):
            e[k] = LinearCost(v.a * f, v.b * f)
    p.merge = LinearCost(p.merge.a * f, p.merge.b * f)
    return p
prof = scaled(Profile.default(), 4.5)
for lanes in (3, 4):
    cl = ClusterModel(nodes=4, workers_per_node=1, bandwidth_gbps=10.0, latency_us=14.0, compute_lanes=lanes, host_cores=16)
    for strat in ("ring", "ps"):
        kw = {"two_way": True} if strat == "ps" else {}
        plan = casync.build_plan("resnet50", workers=4, strategy=strat, codec="onebit", bucket_bytes=25 * 2**20, **kw)
        for F in (0.0, 0.0357):
            rt = backward_ready_times("resnet50", F) if F else None
            tl = casync.simulate(plan, cl, prof, ready_times=rt)
            print(f"lanes {lanes} {strat:4} backward {F*1e3:5.1f} ms: iteration {tl.iteration_time*1e3:6.1f} ms, sync span {tl.sync_time()*1e3:6.1f}")
