"""Run the time-to-accuracy comparison: every (configuration, seed) on the setup's gloo ranks, then the summary.

The runs go to one set of rank processes, seed after seed and configuration after configuration within a seed
(so a drift in the machine's load touches every configuration alike).  A run that fails ends those processes
(the first rank to exit with an error ends all of them at once: never a hang); it is recorded with its error and
the remaining runs go on in fresh ones.  Ranks that fail before their first run (bad data, a bad option) fail
the whole comparison with the rank's output.  A run making no progress for ``stall_s`` counts as failed.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from ...tasks.schedules import check_schedule
from ..ranks import RankError, run_ranks
from ..runner import _short, machine_info
from ..setup import Setup
from .configs import REFERENCE, Config
from .curves import reference_target, summarize, sync_share, target_step

ENTRY = "from casync.bench.tta.rank import main; main()"


class TTAError(RuntimeError):
    """The comparison could not run at all (the ranks failed before their first run); carries a rank's output."""


def eval_steps(steps: int, every: int) -> list[int]:
    """Evaluation points: every ``every`` steps, the target step (80 %) and the last step."""
    if steps < 1 or every < 1:
        raise ValueError(f"--steps and --eval-every must be >= 1, got {steps} and {every}")
    return sorted({*range(every, steps + 1, every), target_step(steps), steps})


def check(task: Any, configs: Sequence[Config], seeds: Sequence[int], ranks: int, data: str | None,
          target: float | None, setup: Setup) -> None:
    """Everything that can be refused before a rank starts, with a message that says what to change."""
    if data is not None and not Path(data).exists():
        raise FileNotFoundError(f"--data {data!r}: no such file or folder")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds must be distinct seeds, at least one, got {list(seeds)}")
    if ranks < 2:
        raise ValueError(f"--ranks must be >= 2 (a data-parallel run), got {ranks}")
    if setup.kind == "netem" and ranks > setup.nodes:
        raise ValueError(f"the emulated cluster has {setup.nodes} nodes; {ranks} ranks need one node each")
    if target is None and REFERENCE not in {c.name for c in configs}:
        raise ValueError(f"the target is the metric {REFERENCE} reaches at 80 % of its steps: add {REFERENCE} to "
                         "--configs, or give --target")
    if target is not None and not isinstance(target, (int, float)):
        raise TypeError(f"--target must be a number, got {target!r}")


def run_tta(task: Any, configs: Sequence[Config], *, seeds: Sequence[int], steps: int, ranks: int, eval_every: int,
            setup: Setup, data: str | None = None, lr: float | None = None, batch_size: int | None = None,
            schedule: str | None = None, target: float | None = None, progress: bool = True, stall_s: float = 900.0, compute_threads: int = 1,
            command: str = "") -> dict[str, Any]:
    """Train ``task`` (a :class:`~casync.tasks.Task`) with every configuration and seed on ``ranks`` gloo ranks
    of ``setup``; returns everything the report needs (the JSON's content; :mod:`casync.bench.tta.report`)."""
    from tqdm.auto import tqdm

    check(task, configs, seeds, ranks, data, target, setup)
    started = time.perf_counter()
    machine = machine_info()
    points = eval_steps(steps, eval_every)
    lr = float(task.defaults["lr"] if lr is None else lr)
    batch_size = int(task.defaults["batch_size"] if batch_size is None else batch_size)
    schedule = check_schedule(task.defaults.get("schedule", "constant") if schedule is None else schedule)
    runs = [{"index": i, "config": c.to_dict(), "seed": s}
            for i, (s, c) in enumerate((s, c) for s in seeds for c in configs)]
    cluster = setup.cluster_model(ranks) if any(c.variant and ":auto:" in c.variant for c in configs) else None
    bar = tqdm(total=len(runs) * steps, desc="tta", unit="step", disable=not progress, dynamic_ncols=True)
    say = bar.write if progress else (lambda msg: print(msg, file=sys.stderr, flush=True))
    results: dict[int, dict[str, Any]] = {}
    manifest = None
    try:
        with tempfile.TemporaryDirectory(prefix="casync-tta-") as tmp:
            spec = {"task": task.name, "data": data, "steps": steps, "eval_steps": points, "lr": lr,
                    "schedule": schedule, "batch_size": batch_size, "results": tmp, "progress": str(Path(tmp) / "progress"),
                    "timeout_s": int(stall_s), "compute_threads": compute_threads,
                    "cluster": cluster.to_dict() if cluster is not None else None}
            pending = list(runs)
            while pending:
                spec["runs"] = pending
                Path(spec["progress"]).unlink(missing_ok=True)
                (Path(tmp) / "spec.json").write_text(json.dumps(spec))
                watch = _Watch(Path(spec["progress"]), runs, results, steps, bar, stall_s, Path(tmp))
                try:
                    run_ranks(setup.launcher(), ranks, ENTRY, ["--spec", str(Path(tmp) / "spec.json")],
                              timeout_s=10 * 365 * 86400.0, what=f"tta {task.name} on {ranks} ranks", poll=watch)
                    failure = "the ranks ended without its result"
                except RankError as exc:
                    if watch.read() is None:
                        raise TTAError(f"the ranks failed before a run started: {exc}") from exc
                    failure = _short(exc)
                watch.collect()
                if (Path(tmp) / "manifest.json").exists():
                    manifest = json.loads((Path(tmp) / "manifest.json").read_text())
                failed = next((r for r in pending if r["index"] not in results), None)
                if failed is not None:  # the runs go in order: the first without a result is the one that failed
                    results[failed["index"]] = _failed(failed, failure)
                    say(f"tta: {failed['config']['name']} seed {failed['seed']} failed: {failure}")
                pending = [r for r in pending if r["index"] not in results]
    finally:
        bar.close()
    ordered = [results[r["index"]] for r in runs]
    if target is None:
        source = f"{REFERENCE}'s metric at step {target_step(steps)} (80 % of {steps}), mean over {len(seeds)} seed(s)"
        try:
            target = reference_target([r for r in ordered if r["config"] == REFERENCE], target_step(steps))
        except ValueError as exc:
            source = f"none: {exc}"
    else:
        source = "given (--target)"
    rows = summarize(ordered, configs, target, steps, task.higher_is_better)
    return {"format": 1, "command": command, "commit": commit(), "machine": machine,
            "setup": {"kind": setup.kind, "description": describe(setup), "nodes": setup.nodes,
                      "bandwidth_gbps": setup.bandwidth_gbps},
            "task": {"name": task.name, "metric": task.metric, "higher_is_better": task.higher_is_better,
                     "data": data, "lr": lr, "schedule": schedule, "batch_size": batch_size,
                     "manifest": manifest},
            "protocol": {"steps": steps, "seeds": list(seeds), "ranks": ranks, "eval_steps": points,
                         "target_step": target_step(steps), "reference": REFERENCE},
            "target": {"value": target, "source": source},
            "configs": {c.name: c.to_dict() for c in configs}, "runs": ordered,
            "summary": rows, "sync_share": sync_share(rows), "seconds": time.perf_counter() - started}


def describe(setup: Setup) -> str:
    """Where the ranks run (the emulated cluster as the bench says it; on one machine, no Ray is involved)."""
    if setup.kind == "local":
        return f"one machine, {setup.cores} cores: gloo ranks on loopback"
    return setup.describe()


def _failed(run: dict[str, Any], error: str) -> dict[str, Any]:
    return {"config": run["config"]["name"], "seed": run["seed"], "points": [], "steps_done": 0, "train_seconds": 0.0,
            "nonfinite": None, "error": error, "consistent": None, "wire_bytes_per_step": None,
            "wire_bytes_total": None, "options": None}


class _Watch:
    """Polled by :func:`~casync.bench.ranks.run_ranks`: moves the progress bar, picks up finished runs, and
    stops ranks that made no progress for ``stall_s``."""

    def __init__(self, path: Path, runs: list[dict[str, Any]], results: dict[int, dict[str, Any]], steps: int,
                 bar: Any, stall_s: float, folder: Path):
        self.path, self.runs, self.results, self.steps, self.bar = path, runs, results, steps, bar
        self.stall_s, self.folder = stall_s, folder
        self.current: int | None = None
        self.step = 0
        self.seen, self.since = "", time.monotonic()

    def collect(self) -> None:
        for file in self.folder.glob("run_*.json"):
            index = int(file.stem.split("_")[1])
            if index not in self.results:
                self.results[index] = json.loads(file.read_text())

    def read(self) -> int | None:
        """The run rank 0 is on (its progress line), or None before the first."""
        text = self.path.read_text() if self.path.exists() else ""
        parts = text.split()
        if len(parts) == 2:
            self.current, self.step = int(parts[0]), int(parts[1])
        now = time.monotonic()
        if text != self.seen:
            self.seen, self.since = text, now
        return self.current

    def __call__(self) -> None:
        if self.read() is None and time.monotonic() - self.since <= self.stall_s:
            return
        if time.monotonic() - self.since > self.stall_s:
            raise RankError(f"no progress for {self.stall_s:.0f} s (run {self.current})")
        self.collect()
        done = sum(self.steps for i in self.results if i != self.current)
        self.bar.n = min(self.bar.total, done + (0 if self.current in self.results else self.step))
        run = self.runs[self.current]
        self.bar.set_description(f"tta {run['config']['name']} seed {run['seed']}", refresh=False)
        self.bar.refresh()


def commit() -> str | None:
    """The checkout's commit (``+dirty`` with uncommitted changes), or None outside a git checkout."""
    import subprocess

    root = Path(__file__).resolve().parents[3]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
