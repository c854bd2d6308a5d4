"""Run a casync plan on a Ray cluster and check it bit for bit against the in-process reference engine.

On a node of a running cluster (``ray start --head`` / ``ray start --address=<head>:6379``, see
docs/cluster.md):

    python examples/cluster_sync.py --address auto --model resnet50 --workers 4 --steps 3

or submitted as a Ray job from a checkout (the job server listens on the head's dashboard port, 8265):

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- python examples/cluster_sync.py

Prints the node every actor landed on, the sync time of every step, and ends with
``bitwise identical to LocalEngine: True``; exits 1 if any result differs from LocalEngine's.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

try:
    import casync
except ImportError:  # a checkout without `pip install -e .`: use the repository this script lives in
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import casync

import ray

from casync.runtime.ray_engine import RayEngine


def gradients(plan: casync.SyncPlan, seed: int) -> list[dict[str, np.ndarray]]:
    """One gradient set per worker, shaped like the plan's tensors (a stand-in for a backward pass)."""
    rng = np.random.default_rng(seed)
    return [{t.name: rng.standard_normal(t.shape, dtype=np.float32) for t in plan.tensors}
            for _ in range(plan.workers)]


def bitwise_equal(a: list[dict[str, np.ndarray]], b: list[dict[str, np.ndarray]]) -> bool:
    """Same keys, shapes, dtypes and bytes for every worker (stricter than ==: tells -0.0 from 0.0, NaN payloads)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.keys() != y.keys():
            return False
        for name in x:
            u, v = np.asarray(x[name]), np.asarray(y[name])
            if u.dtype != v.dtype or u.shape != v.shape or u.tobytes() != v.tobytes():
                return False
    return True


def node_labels() -> dict[str, str]:
    """Ray node id -> "ip (head)" / "ip" for the nodes of the connected cluster."""
    labels = {}
    for n in ray.nodes():
        head = " head" if n.get("Resources", {}).get("node:__internal_head__") else ""
        labels[n["NodeID"]] = f"{n.get('NodeManagerAddress', '?')}{head}"
    return labels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", default="auto",
                        help='Ray cluster to join: "auto" (the cluster started on this node, or RAY_ADDRESS; '
                             'what a submitted job uses), "host:port" of the head\'s GCS, or "ray://host:10001"')
    parser.add_argument("--model", default="resnet50", help="built-in model whose gradient shapes to sync")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--strategy", default="ring", help="ps | ring | allgather")
    parser.add_argument("--codec", default="onebit", help='codec spec, e.g. "topk:ratio=0.01"; "none" = no compression')
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--placement", default="spread", choices=["spread", "pack"])
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds allowed for actor start-up and each sync")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    codec = None if args.codec.lower() == "none" else args.codec
    plan = casync.build_plan(args.model, workers=args.workers, strategy=args.strategy, codec=codec, seed=args.seed)
    print(f"casync from {Path(casync.__file__).parent}")  # on a cluster: is every node running the same code?
    print(f"plan: {plan!r}, {plan.wire_bytes() / 2**20:.2f} MiB on the wire per step")
    reference = casync.LocalEngine(plan)
    identical = True
    with RayEngine(plan, address=args.address, timeout_s=args.timeout, placement=args.placement) as engine:
        resources = ray.cluster_resources()
        print(f"cluster: {len(ray.nodes())} node(s), {resources.get('CPU', 0):g} CPUs, "
              f"GCS {ray.get_runtime_context().gcs_address}")
        labels = node_labels()
        nodes = engine.actor_nodes()
        for actor, node in nodes.items():
            print(f"  {actor:<10} on node {node[:12]}  {labels.get(node, '?')}")
        print(f"actors on {len(set(nodes.values()))} distinct node(s) (placement={args.placement})")
        for step in range(args.steps):
            grads = gradients(plan, seed=args.seed + step)
            start = time.perf_counter()
            out = engine.sync(grads)
            elapsed = time.perf_counter() - start
            same = bitwise_equal(out, reference.sync(grads))
            identical &= same
            print(f"step {step}: sync {1000 * elapsed:.1f} ms, bitwise equal to LocalEngine: {same}")
    print(f"bitwise identical to LocalEngine: {identical}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
