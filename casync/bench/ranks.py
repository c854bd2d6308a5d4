"""Start a job's gloo rank processes the setup's way and watch them: one copy for the baselines and the
time-to-accuracy mode.

Rank ``r`` runs ``launcher.prefix(r) + [python, "-c", entry, *args, "--rank", r, "--world", N, "--master",
host:port]`` with the launcher's environment, one thread for torch and GPUs hidden (the ranks are gloo ranks on
the CPU by design: PyTorch's ``powerSGD_hook`` raises on CPU buckets wherever CUDA is available).  The first rank
that exits with an error, or a deadline, ends every rank at once and raises with that rank's output: a failure
is never a hang.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence


def leave_without_teardown() -> None:
    """End a rank process that has done all its work, skipping interpreter teardown: torch's gloo/DDP helper
    threads sometimes abort the process while being destroyed at exit ("terminate called without an active
    exception"), which would turn a finished rank into a failed one."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class RankError(RuntimeError):
    """A rank failed, or the ranks did not finish in time; the message carries the rank's output."""


@dataclass(frozen=True)
class RankLauncher:
    """How rank ``r`` of a baseline starts: a command prefix, extra environment, and the rendezvous host."""

    master_addr: str
    prefix: Callable[[int], list[str]]
    env: Callable[[int], dict[str, str]]
    port: Callable[[], int]


def run_ranks(launcher: RankLauncher, workers: int, entry: str, args: Sequence[str], *, timeout_s: float,
              what: str, poll: Callable[[], None] | None = None, error: type[RankError] = RankError) -> None:
    """Run ``workers`` ranks of ``python -c entry args`` and wait until all have exited 0.

    ``poll`` is called about ten times a second while they run (a progress bar; it may raise to stop them).
    Raises ``error`` naming ``what`` with the failing rank's output when a rank exits non-zero or the ranks run
    past ``timeout_s``; every rank process is ended either way.
    """
    with tempfile.TemporaryDirectory(prefix="casync-ranks-") as tmp:
        master = f"{launcher.master_addr}:{launcher.port()}"
        procs: list[subprocess.Popen] = []
        logs = []
        # a SIGTERM to this process (a job's timeout) must end the ranks too: they run in sessions of their own
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) \
            if threading.current_thread() is threading.main_thread() else None
        try:
            for rank in range(workers):
                log = open(Path(tmp) / f"rank{rank}.log", "w+")
                logs.append(log)
                # -c, not -m: a package that imports the rank's module first would run it a second time under -m
                cmd = launcher.prefix(rank) + [sys.executable, "-c", entry, *args, "--rank", str(rank),
                                               "--world", str(workers), "--master", master]
                env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", **launcher.env(rank))
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                              start_new_session=True))
            deadline = time.monotonic() + timeout_s
            while any(p.poll() is None for p in procs):
                failed = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
                if failed or time.monotonic() > deadline:
                    rank = failed[0] if failed else 0
                    why = f"rank {rank} exited with {procs[rank].returncode}" if failed else \
                        f"no result within {timeout_s:.0f}s"
                    raise error(f"{what}: {why}; its output:\n{_tail(logs[rank])}")
                if poll is not None:
                    poll()
                time.sleep(0.1)
            failed = [r for r, p in enumerate(procs) if p.returncode != 0]
            if failed:
                raise error(f"{what}: rank {failed[0]} exited with {procs[failed[0]].returncode}; its output:\n"
                            + _tail(logs[failed[0]]))
            if poll is not None:
                poll()
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for log in logs:
                log.close()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _tail(log) -> str:
    log.flush()
    log.seek(0)
    return log.read()[-3000:]
