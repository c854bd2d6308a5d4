"""Run a function on N gloo ranks (real processes, as torchrun would start them) and collect what each returns.

``run_ranks("tests.torch.scenarios:name", world, **kwargs)`` starts ``world`` processes (forkserver: torch is
imported once); each joins a gloo job at a store this process hosts with ``init_process_group`` (the script's
own default group), runs ``name(rank, world, **kwargs)`` and sends back its return value, or the exception it
raised as ``RankError(kind, message)``.  A rank that dies is reported as ``RankError("died", ...)``.
"""
from __future__ import annotations

import importlib
import os
import time
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_for
from typing import Any

from casync.transport.torchdist import host_store, init_group


@dataclass
class RankError:
    """What a rank raised (or that it died): the exception's class name, its message, seconds since start."""

    kind: str
    message: str
    elapsed: float = 0.0


def _entry(conn: Any, target: str, rank: int, world: int, port: int, kwargs: dict) -> None:
    start = time.monotonic()
    try:
        import torch

        torch.set_num_threads(1)
        init_group(rank, world, "127.0.0.1", port, timeout_s=120)
        module, name = target.split(":")
        result = getattr(importlib.import_module(module), name)(rank, world, **kwargs)
        conn.send(("ok", result))
    except BaseException as exc:
        import traceback

        conn.send(("error", RankError(type(exc).__name__, f"{exc}\n{traceback.format_exc()[-3000:]}",
                                      time.monotonic() - start)))
    finally:
        conn.close()
        os._exit(0)  # without torch's teardown: gloo threads may still wait on a peer that failed


def run_ranks(target: str, world: int, timeout_s: float = 240.0, **kwargs: Any) -> list[Any]:
    """Each rank's return value (or :class:`RankError`), in rank order."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "casync.torch", target.split(":")[0]])
    store = host_store(120)  # where the ranks meet: a port this process holds, no race for a free one
    port = store.port
    conns, procs = [], []
    for rank in range(world):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_entry, args=(child, target, rank, world, port, kwargs), daemon=True)
        proc.start()
        child.close()
        conns.append(parent)
        procs.append(proc)
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    pending = dict(enumerate(conns))
    try:
        while pending and time.monotonic() < deadline:
            for conn in wait_for(list(pending.values()), timeout=1.0):
                rank = next(r for r, c in pending.items() if c is conn)
                del pending[rank]
                try:
                    status, value = conn.recv()
                except (EOFError, OSError):
                    results[rank] = RankError("died", f"rank {rank} exited with {procs[rank].exitcode}")
                    continue
                results[rank] = value
        for rank in pending:
            results[rank] = RankError("timeout", f"rank {rank} returned nothing within {timeout_s:.0f}s")
    finally:
        for proc in procs:
            proc.join(2)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for conn in conns:
            conn.close()
    return [results[r] for r in range(world)]


def ok(results: list[Any]) -> list[Any]:
    """The results, after asserting that no rank failed (showing what each failed with)."""
    failed = {r: v for r, v in enumerate(results) if isinstance(v, RankError)}
    assert not failed, "\n".join(f"rank {r}: {e.kind}: {e.message}" for r, e in failed.items())
    return results
