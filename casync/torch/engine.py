"""``TorchDistEngine``: a plan's actors as torch.distributed processes, for the conformance matrix and debugging.

One process per actor of the plan (every worker and every dedicated PS server), started with
``torch.multiprocessing`` (forkserver: torch is imported once, each rank forks from it).  The processes form a
gloo job of their own; each makes casync's process groups over it (``casync.torch.group``) and runs its actor's
share of the plan on the per-rank executor (``casync.torch.runner``), exactly as a rank of a DDP job does with
the hook.  The driver hands each worker its flat bucket gradients through a pipe and takes back its results.
"""
from __future__ import annotations

import os
import time
from multiprocessing.connection import wait as wait_for
from typing import Any

import numpy as np

from casync.strategies import BUILT_IN, get_strategy, register_strategy

from ..engines.collector import freeze_setup_heap
from ..engines.contract import EngineBase, fresh_results
from ..engines.inputs import check_flats
from ..engines.nonfinite import SyncOutput, layouts, scan_worker, void_step, voids_step
from ..engines.state import EngineState
from ..engines.timeline import op_rows
from ..errors import SyncError, SyncTimeoutError, WorkerLostError
from ..plan.syncplan import SyncPlan
from ..transport.torchdist import host_store, init_group

_ERRORS = {cls.__name__: cls for cls in (SyncError, SyncTimeoutError, WorkerLostError)}


def _rank_main(conn: Any, rank: int, actors: list[str], port: int, plan_data: dict, timeout_s: float,
               transport: str, custom: list[Any]) -> None:
    """One rank: join the job, make casync's groups, then serve the driver's requests until told to stop."""
    try:
        for strategy in custom:  # strategies registered in the driver (a torchrun rank's own script registers its)
            register_strategy(strategy, replace=True)
        import torch

        from .group import CasyncGroup
        from .runner import PlanRunner

        torch.set_num_threads(1)
        init_group(rank, len(actors), "127.0.0.1", port, timeout_s=timeout_s)
        plan = SyncPlan.from_dict(plan_data, source="the driver's plan")
        runner = PlanRunner(plan, CasyncGroup(None, timeout_s, transport), actors)
        freeze_setup_heap()  # set up: a full collection inside a step would traverse all of it
        conn.send(("ready", os.getpid()))
        while True:
            request = conn.recv()
            kind = request[0]
            if kind == "step":
                _, step, flats = request
                runner.begin(step)
                for bucket, flat in flats.items():
                    runner.provide(bucket, flat)
                outcome = runner.run(vote=False)  # the driver decided NaN/Inf policy before sending
                runner.commit(outcome)
                conn.send(("ok", outcome.results, outcome.records))
            elif kind == "get_residuals":
                conn.send(("ok", dict(runner.residuals)))  # arrays, deferred ones computed
            elif kind == "set_residuals":
                runner.set_residuals(request[1])
                conn.send(("ok",))
            elif kind == "close":
                runner.close()
                conn.send(("ok",))
                break
    except BaseException as exc:  # the driver raises it, typed
        try:
            conn.send(("error", type(exc).__name__, f"{actors[rank]}: {exc}"[:2000]))
        except Exception:
            pass
    finally:
        conn.close()
        os._exit(0)  # leave without torch's teardown (gloo's threads may still wait on a failed peer)


class TorchDistEngine(EngineBase):
    """Execute ``plan`` on one torch.distributed process per actor; same contract as :class:`casync.LocalEngine`,
    bit-identical results.  ``timeout_s`` bounds start-up and every sync; ``transport``: ``"direct"`` (shared
    memory between the processes, which share this machine) or ``"gloo"``."""

    name = "torch"

    def __init__(self, plan: SyncPlan, timeout_s: float = 60.0, transport: str = "direct"):
        if not isinstance(plan, SyncPlan):
            raise TypeError(f"TorchDistEngine needs a SyncPlan, got {type(plan).__name__}")
        plan.require_executable("TorchDistEngine")
        if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < 1e9):
            raise ValueError(f"timeout_s must be a finite positive number of seconds, got {timeout_s!r}")
        if transport not in ("direct", "gloo"):
            raise ValueError(f"transport must be 'direct' or 'gloo', got {transport!r}")
        super().__init__()
        import torch.multiprocessing as mp

        self.plan = plan
        self.timeout_s = float(timeout_s)
        self.state = EngineState()
        self.actors = plan.actors
        self._layouts = layouts(plan)
        self._send_of = {n: next(iter(plan.graph.predecessors(n))) for n in plan.nodes(op="recv")}
        self._broken: str | None = None
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "torch.distributed", "casync.torch.runner"])
        self._store = host_store(self.timeout_s)  # where the ranks meet
        port, data = self._store.port, plan.to_dict()
        custom = [get_strategy(name) for name in sorted({b.strategy for b in plan.buckets}) if name not in BUILT_IN]
        self._conns, self._procs = [], []
        try:
            for rank in range(len(self.actors)):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_rank_main, args=(child, rank, self.actors, port, data, self.timeout_s,
                                                            transport, custom), daemon=True, name=f"casync-{self.actors[rank]}")
                proc.start()
                child.close()
                self._conns.append(parent)
                self._procs.append(proc)
            self.pids = [reply[0] for reply in self._collect("starting the ranks", self.timeout_s + 60)]
        except BaseException:
            self.close()
            raise

    # -- talking to the ranks ----------------------------------------------------------------------------------
    def _collect(self, what: str, timeout_s: float | None = None) -> list[tuple]:
        """One reply from every rank, in rank order; a dead rank, an error or the deadline raise typed errors."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s + 30)
        replies: dict[int, tuple] = {}
        errors: list[tuple[int, str, str]] = []
        pending = dict(enumerate(self._conns))
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail(f"no reply from {[self.actors[r] for r in pending]} within {timeout_s or self.timeout_s:.0f}s")
                raise SyncTimeoutError(f"{what}: {[self.actors[r] for r in pending]} did not answer within the timeout")
            for conn in wait_for(list(pending.values()), timeout=min(left, 1.0)):
                rank = next(r for r, c in pending.items() if c is conn)
                del pending[rank]
                try:
                    reply = conn.recv()
                except (EOFError, OSError):
                    errors.append((rank, "WorkerLostError", f"{self.actors[rank]} died (exit code "
                                                            f"{self._procs[rank].exitcode})"))
                    continue
                if reply[0] == "error":
                    errors.append((rank, reply[1], reply[2]))
                else:
                    replies[rank] = reply[1:]
            if errors and pending and any(not p.is_alive() for p in self._procs):
                break  # a rank died: the others fail within their timeout; do not wait for them here
        if errors:
            lost = [self.actors[r] for r, p in enumerate(self._procs) if not p.is_alive() and p.exitcode not in (0,)]
            died = [e for e in errors if e[1] == "WorkerLostError" and "died" in e[2]]
            rank, kind, message = died[0] if died else errors[0]
            self._fail(message)
            cls = _ERRORS.get(kind, SyncError)
            if lost and cls is SyncError:
                cls = WorkerLostError
            raise cls(f"{what}: {message}" + (f" (others: {[e[2][:200] for e in errors if e[0] != rank][:3]})"
                                              if len(errors) > 1 else ""))
        return [replies[r] for r in range(len(self._conns))]

    def _request(self, messages: list[tuple], what: str) -> list[tuple]:
        self._check_usable()
        for conn, message in zip(self._conns, messages):
            conn.send(message)
        return self._collect(what)

    def _check_usable(self) -> None:
        if self._broken:
            raise SyncError(f"TorchDistEngine failed earlier ({self._broken}); build a new one and "
                            "load_state_dict() the last saved state")

    def _fail(self, reason: str) -> None:
        self._broken = self._broken or reason
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()

    # -- the engine ------------------------------------------------------------------------------------------------
    def run_flat(self, flats: list[Any]) -> SyncOutput:
        """Hand each worker its flat bucket buffers, run the step on every rank, return fresh results."""
        self._check_usable()
        check_flats(self.plan, flats)
        step = self.state.step
        reports = [r for w, flat in enumerate(flats) for r in scan_worker(self._layouts, w, flat)[0]]
        if voids_step(self.plan.nonfinite, reports):
            out = void_step(self.plan, reports)  # raises under "raise": nothing changed
            self.state = EngineState(step=step + 1, residuals={})
            return out
        messages = [("step", step, flats[int(a.split(":")[1])] if a.startswith("worker:") else {})
                    for a in self.actors]
        replies = self._request(messages, f"sync step {step}")
        self._timeline.add(step, op_rows(step, {a: r[1] for a, r in zip(self.actors, replies)}, self._send_of))
        out = fresh_results(self.plan, [replies[w][0] for w in range(self.plan.workers)])
        self.state = EngineState(step=step + 1, residuals={})
        return SyncOutput(out, nonfinite=reports)

    def state_dict(self) -> dict[str, Any]:
        """Error-feedback residuals gathered from every rank, and the step counter."""
        residuals: dict[str, np.ndarray] = {}
        for (part,) in self._request([("get_residuals",)] * len(self._conns), "reading state"):
            residuals.update(part)
        return EngineState(step=self.state.step, residuals=residuals).to_dict(self.plan)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore residuals and step (validated against the plan) into the ranks."""
        restored = EngineState.from_dict(self.plan, state)
        owner = {a["ef_key"]: a["actor"] for _, a in self.plan.graph.nodes(data=True) if a["op"] == "encode" and a["ef"]}
        by_actor: dict[str, dict[str, np.ndarray]] = {a: {} for a in self.actors}
        for key, value in restored.residuals.items():
            by_actor[owner[key]][key] = value
        self._request([("set_residuals", by_actor[a]) for a in self.actors], "restoring state")
        self.state = EngineState(step=restored.step, residuals={})

    def close(self) -> None:
        """Stop the rank processes (killing those that do not stop within a few seconds)."""
        if not self._broken and self._conns:
            try:
                for conn in self._conns:
                    conn.send(("close",))
                self._collect("closing", 10)
            except Exception:
                pass
        for proc in self._procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for conn in self._conns:
            conn.close()
        self._conns, self._procs = [], []
        self._broken = self._broken or "closed"


__all__ = ["TorchDistEngine"]
