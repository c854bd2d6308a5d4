"""casync's own process groups inside a torch.distributed job, and the channel a plan's executor runs over.

A DDP script (torchrun, Ray Train) already has a default process group, whose timeout is usually 30 minutes
and on which DDP runs its own collectives.  casync never sends on it: :class:`CasyncGroup` makes two groups of
its own over the same ranks with ``new_group`` and casync's own timeout, so a dead or stuck peer surfaces as a
:class:`~casync.errors.SyncError` within ``timeout_s``:

* ``data``: the executor's point-to-point payloads (gloo ``isend``/``irecv`` of NumPy byte buffers);
* ``control``: small collectives at step boundaries (the plan check, parameter CRCs, NaN/Inf votes, the
  uncompressed warm-up all-reduce, gathering state), never concurrent with each other.

Both are gloo groups.  The executor's codecs run on the host and its transfers are matched by tag (bodies and
headers are posted ahead of the step), which NCCL's point-to-point calls do not offer (they ignore tags and
match in posting order); on GPU machines gradients are staged through host memory and the compressed payloads
cross the network over gloo.  Ranks on one machine (same host, same boot, same network namespace) exchange
payload bodies through shared memory (``casync.transport.shm``) with ``transport="direct"`` (default).
"""
from __future__ import annotations

import datetime
import os
import socket
import uuid
from typing import Any, Sequence

from ..engines.memory import keep_freed_memory
from ..errors import SyncError
from ..plan.syncplan import SyncPlan
from ..schedule import plan_transfers
from ..transport.shm import ShmChannel, arenas
from ..transport.torchdist import TorchChannel, as_sync_error

TRANSPORTS = ("direct", "gloo")


def node_identity() -> str:
    """What makes two ranks share memory: the host, its boot, and the network namespace (the emulated cluster
    of ``benchmarks/netem`` puts each rank in its own namespace on one machine: those must use the links)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            boot = file.read().strip()
    except OSError:
        boot = ""
    try:
        netns = str(os.stat("/proc/self/ns/net").st_ino)
    except OSError:
        netns = ""
    return f"{socket.gethostname()}/{boot}/{netns}"


class CasyncGroup:
    """casync's process groups over the ranks of ``process_group`` (None: every rank of the default group).

    Every rank of that group must construct it at the same point (``new_group`` is collective).  ``rank`` and
    ``world`` are positions in it: rank ``i`` runs the plan's actor ``worker:i``.
    """

    def __init__(self, process_group: Any = None, timeout_s: float = 60.0, transport: str = "direct"):
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("casync.torch needs an initialized torch.distributed job: call "
                               "torch.distributed.init_process_group (torchrun and Ray Train do) first")
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {list(TRANSPORTS)}, got {transport!r}")
        if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < float("inf")):
            raise ValueError(f"timeout_s must be a finite positive number of seconds, got {timeout_s!r}")
        self._dist = dist
        self.timeout_s = float(timeout_s)
        self.transport = transport
        if process_group is None:
            ranks = list(range(dist.get_world_size()))
        else:
            ranks = list(dist.get_process_group_ranks(process_group))
        me = dist.get_rank()
        if me not in ranks:
            raise ValueError(f"this process (global rank {me}) is not in the process group {ranks}")
        self.ranks = ranks  # global ranks, by group rank
        self.rank = ranks.index(me)
        self.world = len(ranks)
        timeout = datetime.timedelta(seconds=self.timeout_s)
        local = process_group is not None  # only the members call new_group for a sub-group
        try:
            self.control = dist.new_group(ranks, timeout=timeout, backend="gloo", use_local_synchronization=local)
            self.data = dist.new_group(ranks, timeout=timeout, backend="gloo", use_local_synchronization=local)
        except Exception as exc:
            raise as_sync_error(exc, "creating casync's process groups") from exc
        self.nodes = self.gather_object(node_identity(), "locating the ranks")
        self._channels: list[ShmChannel] = []
        keep_freed_memory()

    # -- small collectives on the control group -----------------------------------------------------------------
    def gather_object(self, obj: Any, what: str) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        out: list[Any] = [None] * self.world
        try:
            self._dist.all_gather_object(out, obj, group=self.control)
        except Exception as exc:
            raise as_sync_error(exc, f"{what} (rank {self.rank} of {self.world})") from exc
        return out

    def broadcast_object(self, obj: Any, what: str) -> Any:
        """Rank 0's ``obj`` on every rank."""
        box = [obj]
        try:
            self._dist.broadcast_object_list(box, src=self.ranks[0], group=self.control)
        except Exception as exc:
            raise as_sync_error(exc, f"{what} (rank {self.rank} of {self.world})") from exc
        return box[0]

    def all_sum(self, value: int, what: str) -> int:
        """The sum of every rank's integer ``value``."""
        import torch

        t = torch.tensor([int(value)], dtype=torch.int64)
        try:
            self._dist.all_reduce(t, group=self.control)
        except Exception as exc:
            raise as_sync_error(exc, f"{what} (rank {self.rank} of {self.world})") from exc
        return int(t.item())

    def barrier(self, what: str) -> None:
        self.all_sum(0, what)

    def broadcast_(self, tensor: Any, what: str) -> None:
        """Overwrite ``tensor`` (a CPU tensor) with rank 0's, in place."""
        try:
            self._dist.broadcast(tensor, src=self.ranks[0], group=self.control)
        except Exception as exc:
            raise as_sync_error(exc, f"{what} (rank {self.rank} of {self.world})") from exc

    def all_reduce_async(self, tensor: Any) -> Any:
        """Start summing a CPU float tensor over the ranks in place; returns a torch Future of ``[tensor]``."""
        return self._dist.all_reduce(tensor, group=self.control, async_op=True).get_future()

    # -- the executor's channel ------------------------------------------------------------------------------------
    def channel(self, plan: SyncPlan, actors: Sequence[str] | None = None, transfer_base: int = 0) -> Any:
        """This rank's channel for ``plan``: ``actors`` names the plan's actor of each rank (default: ``worker:i``
        for rank ``i``).  With ``transport="direct"`` bodies between ranks of one machine go through shared
        memory; every rank must call this at the same point (it synchronizes the arenas' set-up)."""
        names = list(actors) if actors is not None else [f"worker:{r}" for r in range(self.world)]
        if len(names) != self.world:
            raise ValueError(f"{len(names)} actor names for a group of {self.world} ranks")
        missing = sorted(set(plan.actors) - set(names))
        if missing:
            raise ValueError(f"the plan's actors {missing} have no rank in this group of {self.world}")
        me = names[self.rank]
        base: Any = TorchChannel(me, {name: r for r, name in enumerate(names)}, group=self.data)
        if self.transport != "direct":
            return base
        node_of = {name: self.nodes[r] for r, name in enumerate(names)}
        layout = arenas(plan_transfers(plan, transfer_base), node_of)
        if not layout:
            return base
        prefix = self.broadcast_object(f"casync{os.getpid()}x{uuid.uuid4().hex[:8]}", "naming shared memory")
        try:
            channel = ShmChannel(base, me, layout, prefix)
        except Exception as exc:  # the others would wait in the barrier below: let them fail there too
            raise SyncError(f"rank {self.rank}: cannot create its shared-memory arena: {exc}") from exc
        self.barrier("creating shared-memory arenas")
        channel.attach()
        self.barrier("mapping shared-memory arenas")
        channel.unlink()
        self._channels.append(channel)
        return channel

    def close(self) -> None:
        """Unmap shared memory and destroy casync's two process groups (their threads and sockets): a script that
        builds a new state or optimizer after closing the old one holds no more groups than before."""
        for channel in self._channels:
            try:
                channel.close()
            except Exception:
                pass
        self._channels.clear()
        for group in (getattr(self, "control", None), getattr(self, "data", None)):
            if group is not None and self._dist.is_initialized():
                try:
                    self._dist.destroy_process_group(group)
                except Exception:  # already gone with the default group
                    pass
        self.control = self.data = None
