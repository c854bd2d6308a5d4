"""The per-rank executor: one actor's share of a plan, run priority-first, compute and communication overlapped.

Whatever hosts an actor — a Ray actor, a torchrun process, a thread in a test — runs its share of every
sync with a :class:`RankExecutor` over a :class:`~casync.transport.base.Channel`:

* the calling thread (and ``compute_threads - 1`` more: NumPy releases the GIL in its array loops, so an actor
  with cores of its own runs that many ops at once, as the simulator's ``ClusterModel.compute_lanes``) runs
  compute ops (encode / decode / merge, through ``casync.primitives.ops.run_node``, as ``LocalEngine`` does) and hands
  payloads to the senders; among ops whose inputs are there each always takes
  the most urgent (``casync.schedule.priority_key``: bucket priority, then hop), so a partition of an urgent
  bucket overtakes the rest as soon as its data is in (preemption at partition granularity); a decode whose
  only reader is a merge is expanded by that merge block by block (its record is short, the merge's carries
  the work), and a merge whose only reader is an error-feedback encode is computed by that encode block by
  block as it adds the residual (the same: the encode's record carries the merge);
* one sender thread per peer writes that peer's messages in the order they were handed over (a transport
  may write a large message inline, which must not hold up the compute thread);
* one receiver thread per peer takes that peer's messages in the order they arrive: a small header naming
  the transfer, then its body (posted ahead: every payload's size is known from its codec), then, only
  when the header says so, the NaN/Inf side channel;
* sender and receiver threads live as long as the executor and take each step's work from a queue
  (:class:`Lane`): starting a thread waits until it runs, a millisecond or more on busy cores, every step;
* a bucket's ops that read the actor's own gradient wait until :meth:`RankExecutor.provide` hands it over,
  so a bucket can start while later gradients are still being computed; with a
  :class:`~casync.engines.nonfinite.GradientScan`, the first op that reads a partition scans it for NaN/Inf
  before using it (flagging it for the side channel), so no scan of the whole gradient holds up the step.

Results, error-feedback residuals and the op records of a step come back from :meth:`RankExecutor.finish`;
residuals are returned, never updated in place, so a failed step leaves the caller's state untouched.  An actor
whose step fails tells every peer still waiting for a message from it (its channel's abort, or abort notices:
:mod:`casync.engines.messages`), so the peers fail at once naming that failure, not at their timeout.
"""
from __future__ import annotations

import functools
import heapq
import queue
import threading
import time
import weakref
from typing import Any, Collection, Mapping

import numpy as np

from casync.primitives.codecs import Codec
from casync.primitives.ops import run_node
from casync.primitives.merge import handed_to_encode, handed_to_merge
from casync.primitives.residuals import Residuals, buffers
from casync.primitives.wire import HEADER_WORDS, SIDE_ITEM_BYTES, attach_side, layout, side_channel, side_count

from ..errors import SyncError, SyncTimeoutError
from ..schedule import ActorShare
from ..transport.base import DONE, Channel, Handle
from .inputs import check_compute_threads, check_result_buffers
from .lanes import Lane, stop_lanes
from .messages import ABORTED, HEADER_TAG, HeaderLedger, abort_error, abort_reason, body_tag, side_tag
from .nonfinite import GradientScan, NonFiniteReport, PartitionScans, certifiers
from .threadclock import run_queue_wait


class RankExecutor:
    """Runs ``share`` (one actor's ops) step after step over ``channel``; see the module docstring."""

    def __init__(self, share: ActorShare, codecs: Mapping[str, Codec], plan_seed: int,
                 partitions: Mapping[str, list[tuple[int, int]]], channel: Channel, timeout_s: float = 60.0,
                 compute_threads: int = 1, overwritable: Collection[str] = (), scan: GradientScan | None = None):
        self.share = share
        #: how to scan this worker's gradients for NaN/Inf inside the ops (see provide); None: never
        self.scan = scan
        #: what the scans of the last step found (NaN/Inf reports per tensor), set by finish()
        self.nonfinite: list[NonFiniteReport] = []
        #: buckets whose results may be written over their gradient (casync.engines.in_place; see provide)
        self.overwritable = frozenset(overwritable)
        self.compute_threads = check_compute_threads(compute_threads, share.actor)
        self.codecs = dict(codecs)
        self.plan_seed = plan_seed
        self.partitions = {b: list(p) for b, p in partitions.items()}
        self.channel = channel
        self.timeout_s = float(timeout_s)
        self.actor = share.actor
        ops = share.ops
        self._plan_layouts = {i: layout(self.codecs[ops[i].attrs["codec"]], ops[i].attrs["numel"])
                              for i in share.sends + share.recvs}
        self._layouts = self._plan_layouts
        self._by_transfer = {ops[i].transfer: i for i in share.recvs}
        self._from_peer: dict[str, list[int]] = {}
        for i in share.recvs:
            self._from_peer.setdefault(ops[i].peer, []).append(i)
        self._to_peer: dict[str, int] = {}
        for i in share.sends:
            self._to_peer[ops[i].peer] = self._to_peer.get(ops[i].peer, 0) + 1
        self._outputs = {b: len(p) for b, p in self.partitions.items()}
        self._sizes = {b: p[-1][1] if p else 0 for b, p in self.partitions.items()}  # each bucket's numel
        # decodes whose one reader is a merge: the merge decodes them block by block (casync.primitives.ops.Deferred);
        # merges whose one reader is an error-feedback encode: the encode computes them
        # (casync.primitives.ops.PendingMerge)
        self._deferred = {i for i, op in enumerate(ops)
                          if handed_to_merge(op.attrs, [ops[c].attrs["op"] for c in op.consumers])
                          or handed_to_encode(op.attrs, [ops[c].attrs for c in op.consumers])}
        self._certifier = certifiers(ops, self._deferred)  # partitions an encode's payload can certify finite
        self._certifying = frozenset(self._certifier.values())  # those encodes
        self._cond = threading.Condition()
        self._step: int | None = None
        self._ledger = HeaderLedger(channel, self._to_peer)  # its lock gates opening and closing a step
        self._pending_abort: BaseException | None = None  # abort() between steps: the next step fails as it opens
        self._failing = threading.Lock()
        self._lanes: dict[tuple[str, str], Lane] = {}  # (direction, peer) -> its thread, reused step after step
        weakref.finalize(self, stop_lanes, self._lanes)

    # -- a step ------------------------------------------------------------------------------------------
    def begin(self, step: int, residuals: Mapping[str, np.ndarray], codecs: Mapping[str, Codec] | None = None,
              out: Mapping[str, np.ndarray] | None = None, spares: Mapping[str, np.ndarray] | None = None) -> None:
        """Open ``step``: post every receive of the step and start the receiver threads.  ``codecs``: this
        step's codec objects by key, when they differ from the plan's (a sparsity warm-up); every actor must
        pass the same.  ``out``: where to write the step's results, one float32 buffer per bucket of this
        actor (a caller that copies its results away each step reuses them: fresh pages cost more to fault
        in than the decodes that fill them); fresh arrays when None.  ``spares``: residual arrays, by key, the
        caller will never read again (those ``residuals`` replaced a step ago): new residuals are written
        there instead of into fresh memory; the ``residuals`` passed here are never written."""
        with self._ledger.lock:
            self._open(step, residuals, codecs, out, spares)
        if self._pending_abort is not None:  # the host gave up before the step was open: fail it, telling the peers
            exc, self._pending_abort = self._pending_abort, None
            self._fail(exc)

    def _open(self, step: int, residuals: Mapping[str, np.ndarray], codecs: Mapping[str, Codec] | None,
              out: Mapping[str, np.ndarray] | None, spares: Mapping[str, np.ndarray] | None) -> None:
        """:meth:`begin`'s work, holding the ledger's lock: the step counts as open only once all of it is set up,
        right before its sender and receiver threads start."""
        if self._step is not None:
            raise SyncError(f"{self.actor}: step {step} begun while step {self._step} is still open")
        results = self._result_buffers(out)
        ops = self.share.ops
        self._codecs = dict(codecs) if codecs else self.codecs
        self._layouts = self._plan_layouts if not codecs else {
            i: layout(self._codecs[ops[i].attrs["codec"]], ops[i].attrs["numel"]) for i in self.share.sends + self.share.recvs}
        self.sent_bytes = self.raw_bytes = 0
        self._deadline = time.monotonic() + self.timeout_s
        self._values: list[Any] = [None] * len(ops)
        self._waiting = [len(op.inputs) for op in ops]
        self._uses = [len(op.consumers) for op in ops]
        self._complete = [False] * len(ops)
        for index in (i for idx in self.share.local.values() for i in idx):
            self._waiting[index] += 1  # its gradient
        self._grads: dict[str, np.ndarray] = {}
        self._flagged: set[tuple[str, int]] = set()
        self._scans = PartitionScans(self.scan, self._flagged)  # of the buckets provided unscanned
        self.nonfinite = []
        self._residuals = Residuals(residuals)  # an encode may leave its new residual deferred in it
        reading = {id(r) for r in buffers(self._residuals).values()}
        self._spares = {k: v for k, v in buffers(spares).items() if id(v) not in reading}  # never one read now
        self._ready: list[tuple[tuple, int]] = []
        self._done = 0
        self._error: BaseException | None = None
        self._records: list[tuple] = []
        self._results = results
        for index, op in enumerate(ops):
            if self._waiting[index] == 0 and op.attrs["op"] != "recv":
                heapq.heappush(self._ready, (op.key, index))
        self._bodies, self._posted = {}, {}
        direct = getattr(self.channel, "body_buffer", None)  # a channel that lets peers write bodies in place
        for i in self.share.recvs:
            op, nbytes = ops[i], self._layouts[i].nbytes
            body = direct(op.peer, op.transfer, nbytes, step) if direct else None
            if body is None:
                body = np.empty(nbytes, np.uint8)
                self._posted[i] = self.channel.irecv(body, op.peer, body_tag(op.transfer))
            else:
                self._posted[i] = DONE  # complete once its header arrives: the peer writes it first
            self._bodies[i] = body
        # every header is posted ahead too (same tag: they fill in the order the peer sends), so a sender
        # never waits for its receiver to ask for the next message
        self._headers = {peer: [(h, self.channel.irecv(h.view(np.uint8), peer, HEADER_TAG))
                                for h in np.zeros((len(idx), HEADER_WORDS), np.int64)]
                         for peer, idx in self._from_peer.items()}
        self._outbox: dict[str, queue.SimpleQueue] = {peer: queue.SimpleQueue() for peer in self._to_peer}
        self._step = step
        self._ledger.opened(step)
        self._calls = [self._hand("recv", peer, self._receive, len(idx)) for peer, idx in self._from_peer.items()]
        self._calls += [self._hand("send", peer, self._deliver, count) for peer, count in self._to_peer.items()]

    def _hand(self, direction: str, peer: str, fn: Any, count: int) -> tuple[str, threading.Event]:
        """Run ``fn(peer, count)`` on the lane of ``peer`` and ``direction`` (started on first use); returns the
        lane's name and the call's done event."""
        lane = self._lanes.get((direction, peer))
        if lane is None:
            arrow = "<-" if direction == "recv" else "->"
            lane = self._lanes[direction, peer] = Lane(f"casync-{direction}-{self.actor}{arrow}{peer}")
        return lane.name, lane.run(fn, peer, count)

    def new_result_buffers(self) -> dict[str, np.ndarray]:
        """Fresh result buffers, one per bucket: what a caller that reuses them passes as ``begin(out=)``."""
        return {b: np.empty(n, np.float32) for b, n in self._sizes.items()}

    def _result_buffers(self, out: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        """One result buffer per bucket: ``out``'s, checked, or fresh ones."""
        return self.new_result_buffers() if out is None else check_result_buffers(self.actor, out, self._sizes)

    def provide(self, bucket: str, flat: np.ndarray, flagged: set[tuple[str, int]] | None = None,
                results_here: bool = False) -> None:
        """This actor's gradient of ``bucket`` (a flat float32 buffer, not modified); ``flagged``: its
        (bucket, partition) pairs that hold NaN/Inf (the caller's scan), whose encodes carry them on the side.
        With ``flagged`` None and a :attr:`scan`, the executor scans the bucket itself, each partition in the
        first op that reads it (before that op uses it); :attr:`nonfinite` names what it found once the step
        finishes.

        ``results_here``: write the bucket's results into ``flat`` itself, this step, each partition after the
        last read of its gradient (a DDP bucket buffer: no copy back).  Only for the buckets in
        :attr:`overwritable`, where the plan orders every read before the writes; a step that fails leaves
        ``flat`` part gradient, part result."""
        n = self._sizes.get(bucket)
        if n is None:
            raise ValueError(f"{self.actor}: gradient for bucket {bucket!r}, which the plan does not have "
                             f"(its buckets: {sorted(self.partitions)[:8]})")
        if not (isinstance(flat, np.ndarray) and flat.dtype == np.float32 and flat.shape == (n,)):
            raise ValueError(f"{self.actor}: the gradient of bucket {bucket!r} must be a flat float32 array of shape "
                             f"({n},), got {getattr(flat, 'dtype', type(flat).__name__)} {getattr(flat, 'shape', '')}")
        if results_here:
            if bucket not in self.overwritable:
                raise ValueError(f"{self.actor}: the results of bucket {bucket!r} cannot be written over its gradient: "
                                 f"the plan does not read every partition before writing its result "
                                 f"(allowed: {sorted(self.overwritable)})")
            if not (flat.flags.c_contiguous and flat.flags.writeable):
                raise ValueError(f"{self.actor}: results_here needs a writeable contiguous gradient for bucket "
                                 f"{bucket!r}")
        with self._cond:
            if bucket in self._grads:
                raise SyncError(f"{self.actor}: gradient of bucket {bucket!r} provided twice in step {self._step}")
            if results_here:  # before any of the bucket's writers can run: each waits for a read of flat
                self._results[bucket] = flat
            self._grads[bucket] = flat
            self._flagged |= set(flagged or ())
            if flagged is None:
                self._scans.expect(bucket, len(self.partitions[bucket]))
            self._deadline = time.monotonic() + self.timeout_s  # progress: timeout_s counts from here again
            self._wake(sum(self._arrived(index) for index in self.share.local.get(bucket, ())))

    def finish(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[tuple]]:
        """Run the step's ops to the end (in this thread); returns (results per bucket, residuals, records).

        Raises :class:`~casync.errors.SyncTimeoutError` when the step makes no progress for ``timeout_s`` (no
        gradient provided, no op done, no payload in; a slow backward whose buckets come within ``timeout_s`` of
        each other is not cut short), naming what it still waits for, or the error a receive or an op raised."""
        helpers = [threading.Thread(target=self._compute_helper, daemon=True, name=f"casync-compute-{self.actor}-{i}")
                   for i in range(1, self.compute_threads)]
        try:
            for thread in helpers:
                thread.start()
            self._compute()
            for name, done in self._calls:
                if not done.wait(max(0.0, self._deadline - time.monotonic())):
                    raise SyncTimeoutError(f"{self.actor}: step {self._step}: {name} still busy "
                                           f"{self.timeout_s:.0f}s after the last op")
            for thread in helpers:
                thread.join(max(0.0, self._deadline - time.monotonic()))
                if thread.is_alive():
                    raise SyncTimeoutError(f"{self.actor}: step {self._step}: {thread.name} still busy after "
                                           f"{self.timeout_s:.0f}s")
            self._raise_if_failed()
            self.nonfinite = self._scans.reports()
            return self._results, self._residuals, self._records
        except BaseException as exc:
            self._fail(exc)
            raise
        finally:
            for thread in helpers:  # told to stop by _fail; one in an op ends it first (ops never block)
                thread.join()
            for key, lane in list(self._lanes.items()):  # one still in a failed step's call: a fresh one next step
                if not lane.idle():
                    lane.stop()
                    del self._lanes[key]
            with self._ledger.lock:
                self._step = None
                self._ledger.opened(None)
            self._values = []

    # -- the compute threads --------------------------------------------------------------------------------
    def _compute_helper(self) -> None:
        """An extra compute thread: what it raises, the calling thread's :meth:`finish` raises."""
        try:
            self._compute()
        except BaseException as exc:
            with self._cond:
                if self._error is None:
                    self._error = exc
                self._cond.notify_all()

    def _compute(self) -> None:
        ops, total = self.share.ops, len(self.share.ops)
        while True:
            with self._cond:
                while not self._ready and self._done < total:
                    self._raise_if_failed()
                    left = self._deadline - time.monotonic()
                    if left <= 0:
                        raise SyncTimeoutError(self._stall_report())
                    self._cond.wait(min(left, 1.0))
                self._raise_if_failed()
                if self._done >= total:
                    return
                _, index = heapq.heappop(self._ready)
            op = ops[index]
            kind = op.attrs["op"]
            t0, cpu0, queued0 = time.time(), time.thread_time(), run_queue_wait()
            try:
                if kind == "send":
                    self._send(op)
                    result = None
                else:
                    result = self._run(index, op)
            except Exception as exc:  # the same error whichever compute thread ran the op, naming the op
                raise SyncError(f"{self.actor}, step {self._step}: {kind} of bucket {op.attrs['bucket']!r}, partition "
                                f"{op.attrs['part']} ({op.node}) failed: {type(exc).__name__}: {exc}") from exc
            queued1 = run_queue_wait()
            queued = None if queued0 is None or queued1 is None else queued1 - queued0  # waiting for a core
            self._records.append((kind, op.attrs["bucket"], op.attrs["part"], t0, time.time(), op.attrs["nbytes"],
                                  op.node, time.thread_time() - cpu0, queued))
            with self._cond:
                self._finished(index, result)

    def _run(self, index: int, op: Any) -> Any:
        a = op.attrs
        local = None
        if a.get("local_input"):
            start, stop = self.partitions[a["bucket"]][a["part"]]
            local = self._grads[a["bucket"]][start:stop]
            encode = self._certifier.get(index)  # an encode whose payload can say whether the partition is finite
            if encode is None or not self._codecs[self.share.ops[encode].attrs["codec"]].certifies_finite or \
                    not self._scans.claim(a["bucket"], a["part"], start, local, encode):
                self._scans.before_read(a["bucket"], a["part"], start, local)
        out = None
        if a.get("output"):  # decodes and merges write their slice of the result in place
            start, stop = self.partitions[a["bucket"]][a["part"]]
            out = self._results[a["bucket"]][start:stop]
        certifying = index in self._certifying
        checked = certifying and (a["bucket"], a["part"]) in self._flagged  # then it encodes checked anyway
        read = self._residuals.raw(a["ef_key"]) if certifying else None
        run = functools.partial(run_node, a, [self._values[i] for i in op.inputs], local, codecs=self._codecs,
                                residuals=self._residuals, plan_seed=self.plan_seed, step=self._step,
                                flagged=self._flagged, out=out, defer=index in self._deferred, spares=self._spares)
        result = run()
        claim = self._scans.take_claim(index) if certifying else None
        if claim is not None and self._scans.settle(claim, not checked and self._codecs[a["codec"]].input_was_finite(
                result)) and not checked:  # NaN/Inf after all: encode again, checked, from the residual it read
            self._residuals.restore(a["ef_key"], read)
            result = run()
        if out is not None and result is not out:
            out[...] = result
        return result

    def _send(self, op: Any) -> None:
        payload = self._values[op.inputs[0]]
        body = self._layouts[op.index].pack(payload)
        side = side_channel(payload)
        header = np.array([op.transfer, self._step, side_count(side), 0], np.int64)
        self.sent_bytes += body.nbytes + (0 if side is None else side.nbytes)
        self.raw_bytes += 4 * op.attrs["numel"]
        self._outbox[op.peer].put((op.transfer, header, body, side))

    def _deliver(self, peer: str, count: int) -> None:
        """Sender thread: write ``peer``'s messages in the order the compute thread handed them over."""
        handles: list[tuple[Handle, Any]] = []
        put_body = getattr(self.channel, "put_body", None)
        try:
            for _ in range(count):
                item = self._outbox[peer].get()
                if item is None:  # the step failed elsewhere
                    return
                transfer, header, body, side = item
                if not (put_body and put_body(body, peer, transfer, self._step)):  # else written in place first
                    handles.append((self.channel.isend(body, peer, body_tag(transfer)), body))
                if side is not None:
                    handles.append((self.channel.isend(side, peer, side_tag(transfer)), side))
                handle = self._ledger.send(header, peer)
                if handle is None:  # an abort notice took this header's place
                    return
                handles.append((handle, header))
            for handle, _ in handles:
                handle.wait()
        except BaseException as exc:  # the compute thread raises it
            with self._cond:
                if self._error is None:
                    self._error = exc
                self._cond.notify_all()

    # -- bookkeeping (under the lock) ---------------------------------------------------------------------
    def _arrived(self, index: int) -> int:
        """One input of op ``index`` is in; returns 1 when that made the op ready (queued), else 0."""
        self._waiting[index] -= 1
        if self._waiting[index] == 0:
            heapq.heappush(self._ready, (self.share.ops[index].key, index))
            return 1
        return 0

    def _wake(self, ready: int) -> None:
        """Wake as many idle compute threads as ops just became ready (all of them once the step is done): waking
        every thread for each op would have the idle ones take the lock and the GIL only to wait again."""
        if self._done >= len(self.share.ops):
            self._cond.notify_all()
        elif ready:
            self._cond.notify(ready)

    def _finished(self, index: int, value: Any) -> None:
        op = self.share.ops[index]
        self._values[index] = value
        self._done += 1
        self._deadline = time.monotonic() + self.timeout_s  # progress
        ready = 0
        for consumer in op.consumers:
            ready += self._arrived(consumer)
        self._complete[index] = True
        for producer in op.inputs:  # free a value once its last consumer ran
            self._uses[producer] -= 1
            if self._uses[producer] == 0:
                self._values[producer] = None
        self._wake(ready)

    # -- receiver threads -----------------------------------------------------------------------------------
    def _receive(self, peer: str, count: int) -> None:
        try:
            for header, handle in self._headers[peer]:
                handle.wait()
                transfer, step, nside = int(header[0]), int(header[1]), int(header[2])
                if transfer == ABORTED:
                    raise abort_error(self.channel, self.actor, peer, kind=nside)  # its third word: the kind
                index = self._by_transfer.get(transfer)
                again = index is not None and self._complete[index]  # a second copy would release its readers twice
                if index is None or again or self.share.ops[index].peer != peer or step != self._step:
                    raise SyncError(f"{self.actor}: unexpected message from {peer}: transfer {transfer} of step {step} "
                                    f"(this actor is in step {self._step}{', and has it already' if again else ''}); "
                                    "the actors run different plans or steps")
                self._posted[index].wait()
                payload = self._layouts[index].unpack(self._bodies[index])
                if nside:
                    side = np.empty(nside * SIDE_ITEM_BYTES, np.uint8)
                    self.channel.irecv(side, peer, side_tag(transfer)).wait()
                    payload = attach_side(payload, side)
                t = time.time()
                op = self.share.ops[index]
                with self._cond:
                    self._records.append(("recv", op.attrs["bucket"], op.attrs["part"], t, t, op.attrs["nbytes"],
                                          op.node, 0.0))
                    self._finished(index, payload)
        except BaseException as exc:  # the compute thread raises it
            with self._cond:
                if self._error is None:
                    self._error = exc
                self._cond.notify_all()

    # -- failures -------------------------------------------------------------------------------------------
    def _raise_if_failed(self) -> None:
        if self._error is not None:
            error = self._error
            if isinstance(error, (SyncError, TimeoutError)):
                raise error
            raise SyncError(f"{self.actor}, step {self._step}: {type(error).__name__}: {error}") from error

    def _stall_report(self) -> str:
        pending = [self.share.ops[i] for i in self.share.recvs if not self._complete[i]]
        peers = sorted({op.peer for op in pending})
        return (f"{self.actor}: step {self._step} made no progress for {self.timeout_s:.0f}s; waiting for "
                f"{len(pending)} payload(s) from {peers[:6]}" if pending else
                f"{self.actor}: step {self._step} made no progress for {self.timeout_s:.0f}s; gradients provided for "
                f"{sorted(self._grads)[:6]}, waiting for the rest")

    def abort(self, exc: BaseException) -> None:
        """Fail the step in flight from outside its threads (the host gave up on it): :meth:`finish` raises
        ``exc``'s failure and the peers waiting for this actor are told.  Between steps, the next step fails
        with it as it opens (telling the peers then): an abort that races the opening of a step is never lost."""
        with self._ledger.lock:
            if self._step is None:
                self._pending_abort = exc
                return
        self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        """Tell the peers to stop waiting for this actor (abort notices, the channel aborts), then let the step
        go.  A failure that a peer's notice caused passes that peer's reason on, so every actor names the first."""
        with self._cond:  # the other compute threads stop at their next op
            if self._error is None:
                self._error = exc
            self._cond.notify_all()
        for outbox in getattr(self, "_outbox", {}).values():
            outbox.put(None)
        reason, kind = abort_reason(self.actor, self._step, exc)
        with self._failing:  # a second failure (the host's abort beside the step's own) aborts after the notices
            self._ledger.tell(reason, kind)
            try:
                self.channel.abort(reason)
            except Exception:
                pass
