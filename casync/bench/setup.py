"""Where a comparison runs: which Ray to use, how the gloo/DDP baseline ranks start, and the ClusterModel
that describes the machine(s) to the simulator and the planner.

* :func:`local_setup` -- an embedded Ray on this machine and baseline ranks on loopback: every worker
  shares one node's memory, so transfers are nearly free and compression rarely pays.
* :func:`netem_setup` -- the emulated cluster of ``benchmarks/netem`` (one network namespace per node,
  tc-shaped veth links): the Ray cluster started there, baseline rank ``r`` inside namespace
  ``csn{r+1}``, so casync's payloads and gloo's traffic cross the same shaped links.
"""
from __future__ import annotations

import os
import random
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..sim.costmodel import ClusterModel
from .baselines import RankLauncher
from .netstat import class_bytes, qdisc_sent_bytes


def node_ip(index: int) -> str:
    """Address of emulated node ``index`` (1-based), as benchmarks/netem/links.sh assigns them."""
    return f"10.77.0.{10 + index}"


@dataclass(frozen=True)
class Setup:
    """A place to run the comparison (see the module docstring)."""

    kind: str                       # "local" | "netem"
    ray_address: str | None         # None: an embedded Ray in this process
    nodes: int                      # machines the workers are spread over (1: all on this one)
    bandwidth_gbps: float | None    # each node's link rate (None: no network between workers)
    latency_us: float               # one-way link latency assumed by the simulator
    cores: int                      # CPU cores of this machine (all nodes share them)
    notes: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        if self.kind == "local":
            return (f"one machine, {self.cores} cores: an embedded Ray (workers share memory, no network) and "
                    "gloo ranks on loopback")
        delay = self.notes.get("delay") or "none"
        return (f"{self.nodes} emulated nodes (network namespaces on a bridge, one Ray node and one gloo rank "
                f"each), links shaped with tc tbf rate {self.notes.get('rate')} on both ends, netem delay "
                f"{delay}; all on one machine with {self.cores} cores")

    def cluster_model(self, workers: int, compute_lanes: int = 1) -> ClusterModel:
        """The ClusterModel of this setup with ``workers`` workers, for the simulator and the planner.

        Local: one node holding every worker, with this machine's cores shared by their compute.  Netem:
        one worker per node on links of the emulated rate, every node competing for this machine's cores
        (``host_cores``).  ``compute_lanes``: ops each actor runs at once (RayEngine's ``compute_threads``).
        """
        if self.kind == "local":
            return ClusterModel(nodes=1, workers_per_node=workers, cores_per_node=self.cores,
                                compute_lanes=compute_lanes)
        if workers > self.nodes:
            raise ValueError(f"the emulated cluster has {self.nodes} nodes; {workers} workers need one node each")
        return ClusterModel(nodes=workers, workers_per_node=1, bandwidth_gbps=float(self.bandwidth_gbps),
                            latency_us=self.latency_us, host_cores=self.cores, compute_lanes=compute_lanes)

    def launcher(self) -> RankLauncher:
        """How the baselines' ranks start in this setup."""
        if self.kind == "local":
            return RankLauncher(master_addr="127.0.0.1", prefix=lambda r: [],
                                env=lambda r: {"GLOO_SOCKET_IFNAME": "lo"}, port=_free_local_port)
        return RankLauncher(master_addr=node_ip(1), prefix=lambda r: ["ip", "netns", "exec", f"csn{r + 1}"],
                            env=lambda r: {"GLOO_SOCKET_IFNAME": f"csv{r + 1}"},
                            port=lambda: random.randint(20000, 29999))  # a fresh namespace: any port is free

    def link_bytes(self) -> int | None:
        """Bytes the worker nodes have sent so far over their emulated links, except the driver's fetch of
        results (object-manager traffic into the head, counted by its own htb class): payloads to other
        workers and those Ray relays through the driver (objects under 100 KiB travel inline via their
        owner), with TCP/IP and Ray protocol overhead.  None where workers share a machine."""
        if self.kind != "netem":
            return None
        sent = sum(qdisc_sent_bytes(f"csv{i}", f"csn{i}") or 0 for i in range(1, self.nodes + 1))
        return sent - class_bytes("csvhb", "1:20")

    @property
    def spread_workers(self) -> bool:
        """Whether each worker actor must be on its own node (checked after placement)."""
        return self.kind == "netem"


def _free_local_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def local_setup(address: str | None = None) -> Setup:
    """This machine: an embedded Ray (or ``address``'s cluster) and baseline ranks on loopback."""
    return Setup(kind="local", ray_address=address, nodes=1, bandwidth_gbps=None, latency_us=0.0, cores=_cores())


def parse_rate_gbps(rate: str) -> float:
    """``"1gbit"`` -> 1.0, ``"500mbit"`` -> 0.5 (tc's rate syntax, the units links.sh accepts)."""
    text = rate.strip().lower()
    for unit, scale in (("gbit", 1.0), ("mbit", 1e-3), ("kbit", 1e-6)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    raise ValueError(f"link rate must look like 1gbit or 500mbit, got {rate!r}")


def parse_delay_us(delay: str) -> float:
    text = delay.strip().lower()
    if not text:
        return 0.0
    for unit, scale in (("us", 1.0), ("ms", 1e3)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    raise ValueError(f"delay must look like 100us or 1ms, got {delay!r}")


def netem_setup(env_file: str | Path, measured_latency_us: float | None = None) -> Setup:
    """The emulated cluster described by the ``links.env`` that ``benchmarks/netem/links.sh up`` writes.

    The simulator's one-way latency is the applied netem delay, or (where the kernel has no netem)
    ``measured_latency_us`` from the link check, else 50 us.
    """
    values: dict[str, str] = {}
    for line in Path(env_file).read_text().splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    for key in ("nodes", "rate", "head"):
        if key not in values:
            raise ValueError(f"{env_file}: missing {key}= (written by benchmarks/netem/links.sh up)")
    delay = values.get("delay", "")
    latency = parse_delay_us(delay) if delay else (measured_latency_us if measured_latency_us is not None else 50.0)
    if values.get("latency_us"):
        latency = float(values["latency_us"])
    return Setup(kind="netem", ray_address=f"{values['head']}:6379", nodes=int(values["nodes"]),
                 bandwidth_gbps=parse_rate_gbps(values["rate"]), latency_us=latency, cores=_cores(),
                 notes={"rate": values["rate"], "delay": delay, "env_file": str(env_file),
                        **{k: v for k, v in values.items() if k.startswith("measured_")}})
