#!/usr/bin/env python
"""Check that the emulated links are what they claim: run inside the head namespace of a cluster that
``netem.sh up`` started (``netem.sh exec python benchmarks/netem/check_links.py``).

* bandwidth: a 100 MB NumPy array made by an actor on node 1 and fetched by an actor on node 2, through
  Ray's object store (the path casync's payloads take), timed on the receiving side;
* latency: TCP round trips of one byte between the two actors (no netem delay -> the veth's own latency).

Prints both and, with ``--out-env links.env``, appends ``measured_gbps``, ``measured_rtt_us`` and
``latency_us`` (half the round trip unless a netem delay was applied) for the benchmark's ClusterModel.
"""
from __future__ import annotations

import argparse
import socket
import statistics
import sys
import time

import numpy as np
import ray


@ray.remote(num_cpus=0)
class Probe:
    """An actor pinned to one emulated node."""

    def make(self, nbytes: int) -> list:
        return [ray.put(np.ones(nbytes // 4, dtype=np.float32))]

    def fetch(self, boxed: list) -> tuple[float, int]:
        t0 = time.perf_counter()
        value = ray.get(boxed[0])
        return time.perf_counter() - t0, value.nbytes

    def serve(self) -> tuple[str, int]:
        self.server = socket.socket()
        self.server.bind(("0.0.0.0", 0))
        self.server.listen(1)
        import threading

        def echo() -> None:
            conn, _ = self.server.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := conn.recv(64):
                conn.sendall(data)

        threading.Thread(target=echo, daemon=True).start()
        return ray.util.get_node_ip_address(), self.server.getsockname()[1]

    def ping(self, host: str, port: int, rounds: int) -> list[float]:
        conn = socket.create_connection((host, port))
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            conn.sendall(b"x")
            conn.recv(64)
            rtts.append(time.perf_counter() - t0)
        conn.close()
        return rtts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--mbytes", type=int, default=100)
    p.add_argument("--out-env", default=None, help="links.env to append the measurements to")
    args = p.parse_args()
    if args.nodes < 2:
        print("check_links.py: one node has no link to check", file=sys.stderr)
        return 0
    ray.init(address="auto", log_to_driver=False, configure_logging=False)
    try:
        a = Probe.options(resources={"casync_node_1": 0.01}).remote()
        b = Probe.options(resources={"casync_node_2": 0.01}).remote()
        rates = []
        for _ in range(3):  # the first includes connection set-up between the object managers
            boxed = ray.get(a.make.remote(args.mbytes * 1_000_000))
            seconds, nbytes = ray.get(b.fetch.remote(boxed))
            rates.append(nbytes * 8 / seconds / 1e9)
            del boxed
        host, port = ray.get(b.serve.remote())
        rtts = ray.get(a.ping.remote(host, port, 200))
        rtt_us = statistics.median(rtts) * 1e6
        gbps = max(rates[1:])
        print(f"check_links.py: node 1 -> node 2 through Ray's object store: {args.mbytes} MB at "
              + ", ".join(f"{r:.3f}" for r in rates) + f" Gbit/s (best after warm-up {gbps:.3f}); TCP round trip "
              f"median {rtt_us:.0f} us", file=sys.stderr)
        if args.out_env:
            values = dict(line.split("=", 1) for line in open(args.out_env).read().splitlines() if "=" in line)
            latency = None if values.get("delay") else rtt_us / 2
            with open(args.out_env, "a") as f:
                f.write(f"measured_gbps={gbps:.3f}\nmeasured_rtt_us={rtt_us:.0f}\n")
                if latency is not None:
                    f.write(f"latency_us={latency:.0f}\n")
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
