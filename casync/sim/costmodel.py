"""The cost model the simulator and planner share: measured op costs (``Profile``) and a cluster (``ClusterModel``).

Compute ops cost ``a + b*n`` seconds for ``n`` float32 elements (fitted per codec by ``casync.profile``).
A payload of ``B`` bytes between two actors of one node costs ``alpha + B/beta`` of object-store copy;
between nodes it occupies the sender's and receiver's NICs for ``B / bandwidth`` and arrives the cluster's
one-way ``latency_us`` later.  A profile calibrated on the Ray engine (``RuntimeCosts``) adds what the
runtime itself costs: slower ops inside loaded actors, a gap per fused task or the executor's cost per op, a
per-hop latency, the data plane's CPU per message and per byte copied, and the cores a backward pass takes
beside the sync.  Profiles are versioned JSON (:data:`PROFILE_VERSION`); older versions still load.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

PROFILE_VERSION = 3
#: version 1: no runtime section; 2: the data plane's thread CPU as one ``message_cpu`` [a, b]; 3: that split into
#: the executor's per message (``message_cpu_s``) and the copies' per byte by data plane (``copy_cpu``), and the
#: backward's cores (``backward_cores``)
READABLE_VERSIONS = (1, 2, 3)
#: what a message's bytes are copied through: shared memory between actors of one node, TCP sockets, gloo, NCCL
COPY_KINDS = ("shm", "tcp", "gloo", "nccl")
#: RayEngine's direct data planes a runtime may be fitted on (``RuntimeCosts.transport``)
DIRECT_TRANSPORTS = ("direct", "tcp", "gloo", "nccl")


@dataclass(frozen=True)
class LinearCost:
    """``seconds = a + b * n``."""

    a: float
    b: float

    def __call__(self, n: float) -> float:
        return self.a + self.b * n


def scale_key(op: str, codec_key: str = "") -> str:
    """The key of ``RuntimeCosts.op_scale`` for an op of a codec (``"encode:onebit"``, ``"merge"``): by codec
    name, whatever its parameters; calibration fits under it and the simulator looks it up."""
    return f"{op}:{codec_key.split('(', 1)[0]}" if codec_key else op


def copy_kind(transport: str, same_node: bool) -> str:
    """What a message's bytes go through on RayEngine's ``transport``: ``"direct"`` and ``"tcp"`` use shared
    memory within a node, gloo (``"direct"``) or TCP sockets (``"tcp"``) between nodes; ``"gloo"`` and ``"nccl"``
    use their process group for both (``casync.runtime.data_plane``)."""
    if transport not in DIRECT_TRANSPORTS:
        raise ValueError(f"unknown direct transport {transport!r}; choose from {list(DIRECT_TRANSPORTS)}")
    if transport in ("gloo", "nccl"):
        return transport
    if same_node:
        return "shm"
    return "tcp" if transport == "tcp" else "gloo"


def _number(value: Any, source: str, name: str, positive: bool = False) -> float:
    """A finite number >= 0 (> 0 with ``positive``), else a ValueError naming the field and what it got."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 or (
            positive and value == 0):
        raise ValueError(f"{source}: runtime.{name} must be a {'positive' if positive else 'non-negative'} "
                         f"finite number, got {value!r}")
    return float(value)


def _pair(value: Any, source: str, name: str) -> LinearCost:
    if (not isinstance(value, (list, tuple)) or len(value) != 2 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 for v in value)):
        raise ValueError(f"{source}: runtime.{name} must be [a, b] with non-negative numbers, got {value!r}")
    return LinearCost(float(value[0]), float(value[1]))


@dataclass(frozen=True)
class RuntimeCosts:
    """What executing on Ray adds to the ops' own cost, fitted from measured timelines (``casync.runtime.calibrate``).

    ``compute_scale``: op time inside a loaded actor / profiled op time.  ``task_gap_s``: idle time between
    two fused tasks of one actor whose inputs were ready.  ``hop``: seconds from a payload's production to
    the receiving task's start, ``a + b * bytes``, within a node.  ``remote_hop``: the same between nodes,
    beyond the link's own time (Ray's object manager locating and pulling the object); None: as ``hop``.
    ``plane``: the data plane they were fitted on, ``"objectstore"`` (the sender copies each payload into the
    store on its lane) or ``"direct"`` (its sender thread copies it: the copy is in ``hop``, and ``op_gap_s``
    is the per-rank executor's own cost per op); ``transport``: which direct data plane (``"direct"``,
    ``"tcp"``, ``"gloo"``; :func:`copy_kind` says what each message goes through).

    CPU the direct plane's threads spend outside the ops, which the simulator charges on the cores of the
    node(s) where the cluster models cores (its latency is already in ``hop``): ``message_cpu_s`` per message
    (the executor's: header, lane hand-off, thread wake-ups), ``copy_cpu`` per byte by what the message's bytes
    go through (``"shm"``, ``"tcp"``, ``"gloo"``, ``"nccl"``: copies into a shared-memory slot, socket writes and
    reads, a process group's send and receive), ``sync_cpu_s`` per actor and sync (Ray's call, the executor's
    step set-up).
    ``backward_cores``: cores one rank's backward pass keeps busy while it produces gradients alone; where a sync
    overlaps a backward (bucket ready times) the simulator charges it on the node's cores, shared fairly with the
    rank's sync (0: not charged).
    """

    compute_scale: float
    task_gap_s: float
    hop: LinearCost
    #: "encode:onebit", "decode:topk", "merge:topk" (a merge adding a codec's decodes itself, and those decodes:
    #: the executor does their work in the merge), "merge" -> scale
    op_scale: dict[str, float] = field(default_factory=dict)
    dispatch_s: float = 0.0  # driver + raylet CPU seconds per task, on the head node's cores
    samples: dict[str, int] = field(default_factory=dict, compare=False)
    remote_hop: LinearCost | None = None  # between nodes, beyond the wire (None: as ``hop``)
    op_gap_s: float = 0.0  # charged on every compute op (the direct plane's executor)
    plane: str = "objectstore"
    message_cpu_s: float = 0.0
    copy_cpu: dict[str, float] = field(default_factory=dict)  # COPY_KINDS -> CPU seconds per byte
    sync_cpu_s: float = 0.0
    transport: str = "direct"
    backward_cores: float = 0.0

    def scale(self, op: str, codec_key: str = "") -> float:
        """The scale fitted for this op and codec, else for the op (``"merge"``), else the overall one."""
        return self.op_scale.get(scale_key(op, codec_key), self.op_scale.get(op, self.compute_scale))

    def copy_per_byte(self, kind: str) -> float:
        """CPU seconds per byte of a message's copies through ``kind`` (:data:`COPY_KINDS`); a kind the calibration
        did not see (gloo between nodes, calibrated on one machine) is priced as shared memory's, else 0."""
        return self.copy_cpu.get(kind, self.copy_cpu.get("shm", 0.0))

    def to_dict(self) -> dict[str, Any]:
        return {"compute_scale": self.compute_scale, "task_gap_s": self.task_gap_s,
                "hop": [self.hop.a, self.hop.b], "op_scale": dict(self.op_scale), "dispatch_s": self.dispatch_s,
                "samples": dict(self.samples), "op_gap_s": self.op_gap_s, "plane": self.plane,
                "transport": self.transport, "message_cpu_s": self.message_cpu_s, "copy_cpu": dict(self.copy_cpu),
                "sync_cpu_s": self.sync_cpu_s, "backward_cores": self.backward_cores,
                **({"remote_hop": [self.remote_hop.a, self.remote_hop.b]} if self.remote_hop is not None else {})}

    @classmethod
    def from_dict(cls, data: Any, source: str, version: int = PROFILE_VERSION) -> "RuntimeCosts":
        """Read a runtime section of a profile of ``version`` (2: its ``message_cpu`` [a, b] is read as
        ``message_cpu_s`` a and shared memory's ``copy_cpu`` b, the one-machine direct plane it was fitted on)."""
        if not isinstance(data, dict):
            raise ValueError(f"{source}: 'runtime' must be an object, got {type(data).__name__}")
        for key in ("compute_scale", "task_gap_s", "hop"):
            if key not in data:
                raise ValueError(f"{source}: runtime is missing {key!r}")
        scale = _number(data["compute_scale"], source, "compute_scale", positive=True)
        gap = _number(data["task_gap_s"], source, "task_gap_s")
        hop = _pair(data["hop"], source, "hop")
        remote = None if data.get("remote_hop") is None else _pair(data["remote_hop"], source, "remote_hop")
        op_scale = data.get("op_scale", {})
        if not isinstance(op_scale, dict) or not all(
                isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                for k, v in op_scale.items()):
            raise ValueError(f"{source}: runtime.op_scale must map op names to positive numbers, got {op_scale!r}")
        samples = data.get("samples", {})
        plane, transport = data.get("plane", "objectstore"), data.get("transport", "direct")
        if plane not in ("objectstore", "direct"):
            raise ValueError(f"{source}: runtime.plane must be 'objectstore' or 'direct', got {plane!r}")
        if transport not in DIRECT_TRANSPORTS:
            raise ValueError(f"{source}: runtime.transport must be one of {list(DIRECT_TRANSPORTS)}, got {transport!r}")
        if version < 3:
            if "copy_cpu" in data or "message_cpu_s" in data:
                raise ValueError(f"{source}: runtime.copy_cpu and message_cpu_s are version 3's; this profile says "
                                 f"version {version}")
            message = None if data.get("message_cpu") is None else _pair(data["message_cpu"], source, "message_cpu")
            per_message, copy = (0.0, {}) if message is None else (message.a, {"shm": message.b})
        else:
            if "message_cpu" in data:
                raise ValueError(f"{source}: runtime.message_cpu is version 2's [a, b]; version 3 has message_cpu_s "
                                 "and copy_cpu")
            per_message = _number(data.get("message_cpu_s", 0.0), source, "message_cpu_s")
            copy = data.get("copy_cpu", {})
            if not isinstance(copy, dict) or not set(copy) <= set(COPY_KINDS):
                raise ValueError(f"{source}: runtime.copy_cpu must map some of {list(COPY_KINDS)} to CPU seconds per "
                                 f"byte, got {copy!r}")
            copy = {k: _number(v, source, f"copy_cpu.{k}") for k, v in copy.items()}
        return cls(scale, gap, hop, {k: float(v) for k, v in op_scale.items()},
                   _number(data.get("dispatch_s", 0.0), source, "dispatch_s"),
                   dict(samples) if isinstance(samples, dict) else {}, remote,
                   _number(data.get("op_gap_s", 0.0), source, "op_gap_s"), plane, per_message, copy,
                   _number(data.get("sync_cpu_s", 0.0), source, "sync_cpu_s"), transport,
                   _number(data.get("backward_cores", 0.0), source, "backward_cores"))


@dataclass
class Profile:
    """Op costs measured on one machine: per codec encode / decode (and encode with error feedback),
    merge per input element, the object-store transfer between actors, and the per-task call overhead."""

    codecs: dict[str, dict[str, LinearCost]]
    merge: LinearCost
    transfer_alpha_s: float
    transfer_beta_bps: float  # bytes per second between two actors on one node
    task_overhead_s: float
    machine: dict[str, Any] = field(default_factory=dict)
    runtime: RuntimeCosts | None = None  # None: ideal runtime (ops at profiled speed, no per-hop latency)

    # -- costs -----------------------------------------------------------------
    def _codec_entry(self, codec_key: str) -> dict[str, LinearCost]:
        if codec_key in self.codecs:
            return self.codecs[codec_key]
        name = codec_key.split("(", 1)[0]
        for key, entry in self.codecs.items():
            if key.split("(", 1)[0] == name:
                return entry
        raise KeyError(f"profile has no costs for codec {codec_key!r} (profiled: {sorted(self.codecs)}); measure "
                       f"them on this machine, e.g. casync.sim.profiler.profile(codecs=[*DEFAULT_CODECS, "
                       f"{name!r}]), and pass that profile as profile=")

    def _scale(self, runtime: bool, op: str, codec_key: str = "") -> float:
        return self.runtime.scale(op, codec_key) if runtime and self.runtime is not None else 1.0

    def encode_s(self, codec_key: str, n: int, error_feedback: bool = False, runtime: bool = True) -> float:
        """Encode cost; ``runtime=False`` gives the micro-benchmark cost without the runtime's scale."""
        entry = self._codec_entry(codec_key)
        cost = entry["encode_ef" if error_feedback and "encode_ef" in entry else "encode"](n)
        return cost * self._scale(runtime, "encode", codec_key)

    def decode_s(self, codec_key: str, n: int, runtime: bool = True) -> float:
        return self._codec_entry(codec_key)["decode"](n) * self._scale(runtime, "decode", codec_key)

    def entries_s(self, codec_key: str, n: int, runtime: bool = True) -> float:
        """A sparsifier's decode handed to its merge (``casync.primitives.merge.Sparse``): its entries, and adding
        them into the merge's sum.  Profiles without an ``entries`` cost price it as a whole decode."""
        entry = self._codec_entry(codec_key)
        return entry.get("entries", entry["decode"])(n) * self._scale(runtime, "merge", codec_key)

    def shared_s(self, codec_key: str, n: int, runtime: bool = True) -> float:
        """A decode that is no output, which the executor runs as ``Codec.decode_shared``: the identity hands out
        its payload's own array, nearly free.  Profiles without a ``shared`` cost for the codec (every codec that
        decodes, and profiles from before it was measured) price it as a whole decode."""
        entry = self._codec_entry(codec_key)
        return entry.get("shared", entry["decode"])(n) * self._scale(runtime, "decode", codec_key)

    def prices_deferred(self, codec_key: str) -> bool:
        """Whether this profile measured ``deferred`` for the codec (see :meth:`deferred_s`)."""
        return "deferred" in self._codec_entry(codec_key)

    def deferred_s(self, codec_key: str, n: int, runtime: bool = True) -> float:
        """A decode handed to its merge block by block (``casync.primitives.merge.Deferred``): what one more such
        payload adds to a merge, decoding and adding it (through the codec's one-pass merge where it has one);
        the merge is then charged one accumulator pass plus its dense inputs.  Profiles without a ``deferred``
        cost price it as a whole decode, and the merge charges it as a dense input."""
        entry = self._codec_entry(codec_key)
        return entry.get("deferred", entry["decode"])(n) * self._scale(runtime, "merge", codec_key)

    def merge_s(self, n: int, inputs: int, runtime: bool = True, codec_key: str = "") -> float:
        """A merge of ``inputs`` dense passes of ``n`` elements; ``codec_key``: the codec whose decodes it adds
        itself (a sparsifier's entries, a block decoder's deferred decodes), whose merges a calibration scales
        apart (``merge:<codec>``: a merge of sparse entries is scattered writes, not a streamed sum)."""
        return self.merge(n * inputs) * self._scale(runtime, "merge", codec_key)

    @property
    def dispatch_s(self) -> float:
        """CPU seconds the driver and raylet spend per fused task, on the head node's cores (calibrated only)."""
        return self.runtime.dispatch_s if self.runtime is not None else 0.0

    @property
    def task_cost_s(self) -> float:
        """Charged once per fused task (same actor, bucket and hop round) on the actor's lane."""
        return self.runtime.task_gap_s if self.runtime is not None else self.task_overhead_s

    def store_s(self, nbytes: int) -> float:
        """CPU seconds the sending actor spends copying a payload into the object store (a runtime calibrated
        on the object store only; the ideal runtime charges the copy to the link, the direct plane to the hop)."""
        return nbytes / self.transfer_beta_bps if self.runtime is not None and self.runtime.plane == "objectstore" \
            else 0.0

    def message_cpu_s(self, nbytes: int, same_node: bool = True) -> float:
        """CPU seconds the data plane's threads spend on one message of ``nbytes`` besides the ops: the executor's
        ``message_cpu_s`` and the copies' ``copy_cpu`` per byte of what the message goes through (``copy_kind``
        of the runtime's transport, within a node or between nodes).  A calibrated direct plane only; 0 otherwise."""
        rt = self.runtime
        if rt is None or rt.plane != "direct":
            return 0.0
        return rt.message_cpu_s + rt.copy_per_byte(copy_kind(rt.transport, same_node)) * nbytes

    def message_cpu_shares(self, nbytes: int, same_node: bool) -> tuple[float, float]:
        """``(sender's, receiver's)`` CPU seconds of one message's threads on their nodes' cores: all of
        :meth:`message_cpu_s` on the sender within a node (its thread copies into the receiver's slot), half
        on each end between nodes."""
        cost = self.message_cpu_s(nbytes, same_node)
        return (cost, 0.0) if same_node else (cost / 2, cost / 2)

    @property
    def backward_cores(self) -> float:
        """Cores one rank's backward keeps busy while it produces gradients alone (calibrated; else 0: not charged)."""
        return self.runtime.backward_cores if self.runtime is not None else 0.0

    def backward_share(self, cores: int, workers: int) -> float:
        """Cores each of ``workers`` ranks' backward takes from a pool of ``cores`` while it runs beside the rank's
        sync: all its :attr:`backward_cores` where the pool has room for every backward and one sync thread per
        rank, else its fair share, ``cores / (workers * (backward_cores + 1))`` per thread.  The simulator and the
        planner's timeline both charge it."""
        b = self.backward_cores
        return b * min(1.0, cores / (workers * (b + 1))) if b > 0 and workers > 0 else 0.0

    @property
    def sync_cpu_s(self) -> float:
        """CPU seconds per actor and sync beyond its ops and messages (calibrated direct plane only; else 0)."""
        return self.runtime.sync_cpu_s if self.runtime is not None else 0.0

    @property
    def op_cost_s(self) -> float:
        """Charged on every compute op on top of its own cost (the direct plane's executor, calibrated)."""
        return self.runtime.op_gap_s if self.runtime is not None else 0.0

    def link_s(self, nbytes: int, same_node: bool, cluster: "ClusterModel") -> tuple[float, float]:
        """``(occupancy, delay)`` of moving a stored payload of ``nbytes``: seconds the sender's egress and the
        receiver's ingress are busy, then seconds until the receiving task can use it."""
        rt = self.runtime
        if same_node:
            if rt is not None:
                return 0.0, rt.hop(nbytes)
            return self.transfer_alpha_s + nbytes / self.transfer_beta_bps, 0.0
        hop = 0.0 if rt is None else (rt.remote_hop if rt.remote_hop is not None else rt.hop)(nbytes)
        return nbytes / cluster.bytes_per_s, cluster.latency_us * 1e-6 + hop

    def with_runtime(self, runtime: RuntimeCosts | None) -> "Profile":
        """A copy of this profile carrying ``runtime`` (``None``: back to the ideal runtime)."""
        from dataclasses import replace

        return replace(self, runtime=runtime)

    # -- files -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"version": PROFILE_VERSION, "machine": self.machine,
                "codecs": {k: {op: [c.a, c.b] for op, c in ops.items()} for k, ops in self.codecs.items()},
                "merge": [self.merge.a, self.merge.b], "transfer_alpha_s": self.transfer_alpha_s,
                "transfer_beta_bps": self.transfer_beta_bps, "task_overhead_s": self.task_overhead_s,
                **({"runtime": self.runtime.to_dict()} if self.runtime is not None else {})}

    @classmethod
    def from_dict(cls, data: Any, source: str = "profile") -> "Profile":
        def cost(value: Any, where: str) -> LinearCost:
            if (not isinstance(value, (list, tuple)) or len(value) != 2
                    or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                               for v in value)):
                raise ValueError(f"{source}: {where} must be [a, b] with finite non-negative numbers, got {value!r}")
            return LinearCost(float(value[0]), float(value[1]))

        if not isinstance(data, dict):
            raise ValueError(f"{source}: expected a JSON object, got {type(data).__name__}")
        if data.get("version") not in READABLE_VERSIONS:
            raise ValueError(f"{source}: unsupported profile version {data.get('version')!r} "
                             f"(this casync reads versions {', '.join(map(str, READABLE_VERSIONS))})")
        for key in ("codecs", "merge", "transfer_alpha_s", "transfer_beta_bps", "task_overhead_s"):
            if key not in data:
                raise ValueError(f"{source}: missing {key!r}")
        if not isinstance(data["codecs"], dict) or not data["codecs"]:
            raise ValueError(f"{source}: 'codecs' must be a non-empty object")
        codecs = {}
        for name, ops in data["codecs"].items():
            if not isinstance(ops, dict) or not {"encode", "decode"} <= set(ops):
                raise ValueError(f"{source}: codec {name!r} needs 'encode' and 'decode' costs")
            codecs[name] = {op: cost(v, f"codecs.{name}.{op}") for op, v in ops.items()}
        for key in ("transfer_alpha_s", "transfer_beta_bps", "task_overhead_s"):
            v = data[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (
                    key == "transfer_beta_bps" and v == 0):
                raise ValueError(f"{source}: {key} must be a finite positive number, got {v!r}")
        if not isinstance(data.get("machine", {}), dict):
            raise ValueError(f"{source}: 'machine' must be an object, got {data['machine']!r}")
        return cls(codecs=codecs, merge=cost(data["merge"], "merge"),
                   transfer_alpha_s=float(data["transfer_alpha_s"]),
                   transfer_beta_bps=float(data["transfer_beta_bps"]),
                   task_overhead_s=float(data["task_overhead_s"]), machine=dict(data.get("machine", {})),
                   runtime=RuntimeCosts.from_dict(data["runtime"], source, data["version"])
                   if data.get("runtime") is not None else None)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Profile":
        """Read a profile written by :meth:`save` (or ``casync profile``); validated, never unpickled."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
        return cls.from_dict(data, source=str(path))

    @classmethod
    def default(cls) -> "Profile":
        """The profile shipped with the package (measured on the 2-core development machine)."""
        text = resources.files("casync").joinpath("data/default_profile.json").read_text()
        return cls.from_dict(json.loads(text), source="casync/data/default_profile.json")


@dataclass(frozen=True)
class ClusterModel:
    """The cluster a plan is simulated on: ``nodes`` x ``workers_per_node`` workers, NICs of
    ``bandwidth_gbps`` with ``latency_us`` one-way latency, ``compute_lanes`` per actor, and optionally
    ``cores_per_node`` CPU cores that all compute on a node competes for (this machine: 2), or
    ``host_cores``: the nodes are emulated on one machine (network namespaces) and all compete for its
    cores."""

    nodes: int = 1
    workers_per_node: int = 4
    bandwidth_gbps: float = 10.0
    latency_us: float = 50.0
    compute_lanes: int = 1
    cores_per_node: int | None = None  # CPU cores the actors of a node share (None: no contention)
    host_cores: int | None = None  # CPU cores every node shares (emulated nodes on one machine); None: not so

    def __post_init__(self) -> None:
        for name in ("cores_per_node", "host_cores"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"ClusterModel.{name} must be None or an int >= 1, got {v!r}")
        if self.cores_per_node is not None and self.host_cores is not None:
            raise ValueError("ClusterModel: give cores_per_node (each node its own cores) or host_cores (all nodes "
                             "share one machine's cores), not both")
        for name in ("nodes", "workers_per_node", "compute_lanes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"ClusterModel.{name} must be an int >= 1, got {v!r}")
        for name in ("bandwidth_gbps", "latency_us"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (
                    name == "bandwidth_gbps" and v == 0):
                raise ValueError(f"ClusterModel.{name} must be a finite positive number, got {v!r}")

    @classmethod
    def for_workers(cls, workers: int, workers_per_node: int = 1, **kw: Any) -> "ClusterModel":
        """Enough nodes for ``workers`` (one worker per node by default, as on a GPU cluster)."""
        for name, v in (("workers", workers), ("workers_per_node", workers_per_node)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        return cls(nodes=max(1, -(-workers // workers_per_node)), workers_per_node=workers_per_node, **kw)

    def core_pool(self, node: int) -> tuple[str, int] | None:
        """``(name, cores)`` of the CPU cores that compute on ``node`` competes for; None: no contention."""
        if self.host_cores:
            return "host", self.host_cores
        if self.cores_per_node:
            return f"node{node}", self.cores_per_node
        return None

    def asymmetry(self, workers: int) -> str | None:
        """Why ``workers`` workers are not interchangeable here (None when they are): a compact template
        (one representative worker) stands for all of them only on a cluster that looks the same from every
        rank: one worker per node, or all workers on one node, and no CPU cores shared between workers."""
        nodes = len({self.node_of(f"worker:{w}") for w in range(workers)})
        if 1 < nodes < workers:
            return (f"{workers} workers on {nodes} nodes ({self.workers_per_node} per node): links within a node "
                    "differ from links between nodes")
        if workers > 1 and (self.host_cores or (self.cores_per_node and nodes == 1)):
            return "the workers share CPU cores"
        return None

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_gbps * 1e9 / 8

    def node_of(self, actor: str) -> int:
        """Workers fill nodes in rank order; dedicated servers are spread round-robin over the nodes."""
        kind, index = actor.split(":")
        if kind == "worker":
            return min(int(index) // self.workers_per_node, self.nodes - 1)
        return int(index) % self.nodes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
