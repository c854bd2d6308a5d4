"""Run a strategy comparison: baselines, casync's grid on RayEngine, the simulated grid; collect rows.

Order: the baselines of every (model, workers) group first (real gloo processes), then every casync cell
on a fresh RayEngine each, then the simulated grid.  A cell that fails is recorded with its error and the
run goes on; :attr:`BenchResult.failures` lists them.
"""
from __future__ import annotations

import math
import os
import platform
import re
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from ..datasets.gradients import exact_mean
from ..engines.memory import WARMUP_SYNCS
from ..engines.timeline import op_time_split
from ..plan.syncplan import SyncPlan
from ..sim.costmodel import Profile
from ..sim.simulator import simulate
from .baselines import BASELINES, REFERENCE, run_baselines
from .fidelity import fidelity_by_group
from .grid import Grid, codec_label, split_transport
from .hooks import is_hook, parse_hook_variant
from .measure import EngineRun, GradientStore, measure_plan
from .predict import sim_plan, make_plan, plan_choices, predict, predicted_sync_s
from .setup import Setup

#: baselines the speed-up table also reports a ratio against (when they ran)
COMPARE_WITH = ("gloo-bucket", "ddp", "ddp-fp16", "ddp-powersgd-r1", "ddp-powersgd-r4")


@dataclass
class Row:
    """One measured configuration: a casync grid cell or a baseline, on one model and worker count."""

    model: str
    workers: int
    system: str            # "casync" | "baseline" | "hook" (a casync configuration through DDP's comm hook)
    strategy: str          # casync strategy label, or the baseline's (hook row's) name
    codec: str             # codec spec ("auto": the planner's pick), or what the baseline sends
    sync_s: float = math.nan           # median sync time over the timed iterations
    sync_all_s: list[float] = field(default_factory=list)
    wall_s: float | None = None        # casync: median run_flat wall time; baselines: forward+backward wall
    wire_bytes: int = 0                # bytes all sends put on the wire in one sync
    link_bytes: int | None = None      # bytes that crossed the emulated links per sync (netem; measured)
    dense_wire_bytes: int = 0          # the same sends uncompressed
    compression: float = 1.0           # dense_wire_bytes / wire_bytes
    speedup: dict[str, float] = field(default_factory=dict)  # baseline name -> its sync time / this one's
    predicted_s: float | None = None   # the simulator's sync time for the same plan on the setup's ClusterModel
    consistent: bool = True            # every worker ended with bit-identical results
    rel_error: float | None = None     # ||result - exact mean|| / ||exact mean||, first iteration
    tasks: int | None = None           # Ray calls per iteration (casync)
    plan: list[dict[str, Any]] | None = None  # per bucket choices (auto rows)
    op_split: dict[str, float] | None = None  # where a rank's op time went (casync and hook rows; op_time_split)
    error: str | None = None

    @property
    def label(self) -> str:
        if self.system == "baseline":
            return BASELINES.get(self.strategy, self.strategy)
        if self.system == "hook":
            return f"DDP + casync hook {parse_hook_variant(self.strategy)[0]} / {self.codec_cell}"
        return f"{self.strategy} / {self.codec_cell}"

    @property
    def codec_cell(self) -> str:
        """The codec; for an ``auto`` row also what the planner chose per bucket (it may send all uncompressed)."""
        label = codec_label(self.codec)
        if self.system in ("casync", "hook") and self.plan:
            used = sorted({f"{p['strategy']}/{codec_label(_spec(p['codec']))}" for p in self.plan})
            return f"{label} → " + ", ".join(used)
        return label

    @property
    def ok(self) -> bool:
        return self.error is None and math.isfinite(self.sync_s)


def _spec(codec_str: str) -> str:
    """``topk(ratio=0.01)`` (a Codec's str) -> ``topk:ratio=0.01`` (a spec codec_label reads)."""
    if "(" not in codec_str:
        return codec_str
    name, params = codec_str[:-1].split("(", 1)
    return f"{name}:{params}"


@dataclass
class SimRow:
    """One simulated configuration."""

    model: str
    workers: int
    bandwidth_gbps: float
    strategy: str
    codec: str
    predicted_s: float
    wire_bytes: int
    dense_wire_bytes: int
    compression: float
    plan: list[dict[str, Any]] | None = None
    error: str | None = None


@dataclass
class BenchResult:
    setup: Setup
    grid: Grid
    rows: list[Row]
    sim_rows: list[SimRow]
    machine: dict[str, Any]
    command: str
    seconds: float
    iters: int
    warmup: int
    timelines: dict[str, dict[str, Any]] = field(default_factory=dict)  # "model/N" -> best/worst measured rows
    head_to_head: dict[str, dict[str, Any]] = field(default_factory=dict)  # "model/N" -> interleaved rounds
    plans: dict[tuple, Any] = field(default_factory=dict, repr=False)    # (model, N, strategy, codec) -> plan
    measured_timelines: dict[tuple, list] = field(default_factory=dict, repr=False)  # same key -> op records
    #: (model, N, hook row, codec) -> the simulator's timeline of the row's plan, buckets ready as DDP handed them over
    hook_predictions: dict[tuple, Any] = field(default_factory=dict, repr=False)
    predicted_with: str = "the packaged profile (ideal runtime, not calibrated on this machine)"  # measured rows'
    #: where the measured rows' profile came from: {"source": "packaged" | "file" | "measured" | "cache", ...}
    calibration: dict[str, Any] = field(default_factory=lambda: {"source": "packaged"})
    sim_predicted_with: str = "the packaged profile"  # what the simulated grid's predictions used
    profile: Profile | None = field(default=None, repr=False)  # that profile (None: the packaged one)

    @property
    def failures(self) -> list[Row | SimRow]:
        return [r for r in self.rows if r.error] + [r for r in self.sim_rows if r.error]

    def group(self, model: str, workers: int) -> list[Row]:
        return [r for r in self.rows if r.model == model and r.workers == workers]

    def groups(self) -> list[tuple[str, int]]:
        return list(dict.fromkeys((r.model, r.workers) for r in self.rows))

    def fastest_hook(self, model: str, workers: int) -> Row | None:
        """The group's fastest "DDP + casync hook" row that ran, or None."""
        done = [r for r in self.group(model, workers) if r.system == "hook" and r.ok]
        return min(done, key=lambda r: r.sync_s) if done else None

    def best_worst(self, model: str, workers: int) -> tuple[Row | None, Row | None]:
        done = sorted((r for r in self.group(model, workers) if r.system == "casync" and r.ok), key=lambda r: r.sync_s)
        return (done[0], done[-1]) if done else (None, None)

    def to_json(self) -> dict[str, Any]:
        return {"setup": {**asdict(self.setup), "description": self.setup.describe()},
                "grid": asdict(self.grid), "machine": self.machine, "command": self.command,
                "seconds": self.seconds, "iters": self.iters, "warmup": self.warmup,
                "rows": [dict(asdict(r), label=r.label) for r in self.rows],
                "simulated": [asdict(r) for r in self.sim_rows], "head_to_head": self.head_to_head,
                "predicted_with": self.predicted_with, "sim_predicted_with": self.sim_predicted_with,
                "calibration": self.calibration, "model_fidelity": fidelity_by_group(self.rows),
                "timelines": self.timelines}


def machine_info() -> dict[str, Any]:
    """CPU, load and library versions, for the note under every result."""
    import numpy as np

    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {"cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                            "cpu": cpu, "platform": platform.platform(), "python": platform.python_version(),
                            "numpy": np.__version__}
    for lib in ("torch", "ray"):
        try:
            info[lib] = __import__(lib).__version__
        except ImportError:
            info[lib] = None
    try:
        info["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    return info


def _dense_wire(plan: Any) -> int:
    return sum(4 * a["numel"] for _, a in plan.graph.nodes(data=True) if a["op"] == "send")


def _short(exc: BaseException) -> str:
    """One line for a table cell: the message's first line and, where the message goes on (a failed rank's
    output), the last line that names an error, so the cause is not cut off with the rest."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    cause = next((line for line in reversed(lines[1:]) if re.search(r"\w(Error|Exception)\b", line)), None)
    text = f"{type(exc).__name__}: {lines[0]}" + (f" ... {cause}" if cause else "")
    return text if len(text) <= 300 else text[:150] + " ... " + text[-145:]


def run_bench(grid: Grid, setup: Setup, *, iters: int = 3, warmup: int = WARMUP_SYNCS, seed: int = 0,
              simulate: bool = True, progress: bool = True, command: str = "", profile: Profile | None = None,
              log: Callable[[str], None] | None = None, head_to_head: int = 0,
              profile_source: str | None = None, calibration: Any = None) -> BenchResult:
    """Measure ``grid`` (casync cells and baselines) in ``setup`` and simulate its large-cluster grid.

    ``head_to_head`` rounds: afterwards, per (model, workers), the fastest casync configuration and the
    reference baselines are measured again, alternating, so that their ratio comes from runs minutes apart
    under the same machine load rather than from opposite ends of a long grid.

    ``profile`` (``profile_source``: its file, for the report) predicts the measured rows and plans their
    ``auto`` cells; a runtime calibrated on this machine belongs to this machine, so the simulated
    large-cluster grid uses only its micro-benchmark costs (the ideal runtime).  ``calibration``
    (``casync.runtime.machine_profile.Calibration``): where a ``profile`` calibrated on this machine came from.
    """
    from tqdm.auto import tqdm

    started = time.perf_counter()
    machine = machine_info()
    cells = grid.cells()
    groups = list(dict.fromkeys((m, w) for m, w, _, _ in cells)) or [(m, w) for m in grid.models for w in grid.workers]
    sim_cells = grid.sim_cells() if simulate else []
    h2h_units = len(groups) * head_to_head if grid.baselines and cells else 0
    torch_rows = tuple(grid.baselines) + tuple(grid.hook_variants())
    bar = tqdm(total=(len(groups) if torch_rows else 0) + len(cells) + len(sim_cells) + h2h_units, desc="bench",
               unit="cfg", disable=not progress, dynamic_ncols=True)
    say = log or (lambda msg: bar.write(msg) if progress else print(msg, file=sys.stderr, flush=True))
    rows: list[Row] = []
    result = BenchResult(setup=setup, grid=grid, rows=rows, sim_rows=[], machine=machine, command=command,
                         seconds=0.0, iters=iters, warmup=warmup)
    result.profile = profile
    if calibration is not None:
        result.predicted_with = f"the packaged profile, {calibration.describe()}"
        result.calibration = calibration.to_json()
    elif profile is not None:
        result.calibration = {"source": "file", "path": profile_source}
        result.predicted_with = (f"the profile {profile_source or '(given)'}"
                                 + (", its Ray runtime calibrated on this machine" if profile.runtime else ""))
        result.sim_predicted_with = (f"the micro-benchmark costs of the profile {profile_source or '(given)'} "
                                     "(its runtime left out: the ideal runtime)")
    sim_profile = profile.with_runtime(None) if profile is not None else None
    try:
        # 1. baselines and the DDP hook rows: real gloo processes, before this process starts or joins Ray
        for model, workers in groups if torch_rows else []:
            bar.set_description(f"baselines {model} N={workers}")
            rows += _baseline_rows(setup, model, workers, torch_rows, iters, warmup, seed, say, grid.compute_threads,
                                   result.measured_timelines, profile, result.hook_predictions)
            bar.update(1)

        # 2. casync cells on RayEngine
        if cells:
            _measure_cells(cells, grid, setup, rows, result, bar, say, iters=iters, warmup=warmup, seed=seed,
                           profile=profile, head_to_head=head_to_head if grid.baselines else 0)

        # 3. the simulated grid (compact templates where exact, else full plans)
        for model, workers, bw, strategy, codec in sim_cells:
            bar.set_description(f"simulate {model} N={workers} {bw:g}G {strategy}/{codec_label(codec)}")
            cluster = _sim_cluster(workers, bw)
            try:
                plan = sim_plan(model, workers, strategy, codec, grid.codecs, cluster, sim_profile, grid.strategies)
                wire = plan.wire_bytes()
                dense = _dense_wire(plan)
                result.sim_rows.append(SimRow(model=model, workers=workers, bandwidth_gbps=bw, strategy=strategy,
                                              codec=codec, predicted_s=predicted_sync_s(predict(plan, cluster, sim_profile)),
                                              wire_bytes=wire, dense_wire_bytes=dense,
                                              compression=dense / wire if wire else 1.0,
                                              plan=plan_choices(plan) if strategy == "auto" else None))
            except Exception as exc:
                result.sim_rows.append(SimRow(model=model, workers=workers, bandwidth_gbps=bw, strategy=strategy,
                                              codec=codec, predicted_s=math.nan, wire_bytes=0, dense_wire_bytes=0,
                                              compression=math.nan, error=_short(exc)))
            bar.update(1)
    finally:
        bar.close()
    _speedups(rows)
    for model, workers in result.groups():
        best, worst = result.best_worst(model, workers)
        hook = result.fastest_hook(model, workers)
        shown = (("best", best), ("worst", worst), ("hook", hook)) if best is not None else (("hook", hook),)
        timelines = {which: dict(_row_key(row), records=result.measured_timelines.get(
            (model, workers, row.strategy, row.codec), [])) for which, row in shown if row is not None}
        if timelines:
            result.timelines[f"{model}/{workers}"] = timelines
    result.seconds = time.perf_counter() - started
    return result


BASELINE_PAYLOAD = {"ddp-fp16": "fp16", "ddp-powersgd-r1": "powersgd r1", "ddp-powersgd-r4": "powersgd r4",
                    "ddp-nocomm": "nothing"}


def _baseline_rows(setup: Setup, model: str, workers: int, names: tuple[str, ...], iters: int, warmup: int,
                   seed: int, say: Callable[[str], None], compute_threads: int = 1,
                   timelines: dict[tuple, list] | None = None, profile: Profile | None = None,
                   predictions: dict[tuple, Any] | None = None) -> list[Row]:
    """One row per baseline of a (model, workers) group; on failure, rows carrying the error.
    ``compute_threads``: ops each rank of a DDP + casync hook row runs at once.  ``timelines``: where each hook
    row's timeline of its last timed iteration goes, keyed like the casync cells'.  A hook row is predicted with
    ``profile`` on the setup's cluster model, its buckets ready when DDP handed them over (the simulated timeline
    goes to ``predictions``, under the same key)."""
    try:
        cluster = setup.cluster_model(workers, compute_lanes=compute_threads)
        raw = run_baselines(setup.launcher(), model, workers, names, iters=iters, warmup=warmup, seed=seed,
                            compute_threads=compute_threads, cluster=cluster, profile=profile)
    except Exception as exc:  # recorded; the comparison goes on without them
        say(f"baselines on {model} N={workers} failed: {exc}")
        return [Row(model=model, workers=workers, system="hook" if is_hook(name) else "baseline", strategy=name,
                    codec=parse_hook_variant(name)[1] if is_hook(name) else "", error=_short(exc)) for name in names]
    rows = []
    for name in names:
        e = raw[name]
        hook = is_hook(name)
        predicted = _hook_prediction(e, cluster, profile, say) if hook else None
        rows.append(Row(model=model, workers=workers, system="hook" if hook else "baseline", strategy=name,
                        codec=parse_hook_variant(name)[1] if hook else BASELINE_PAYLOAD.get(name, "none"),
                        sync_s=e["sync_median_s"], sync_all_s=e["sync_s"],
                        wall_s=sorted(e["backward_s"])[len(e["backward_s"]) // 2], wire_bytes=e["wire_bytes"],
                        dense_wire_bytes=e["dense_wire_bytes"],
                        compression=e["dense_wire_bytes"] / e["wire_bytes"] if e["wire_bytes"] else 1.0,
                        consistent=e["consistent"], rel_error=e.get("rel_error"), link_bytes=e.get("link_bytes"),
                        plan=e.get("plan"), predicted_s=predicted.iteration_time if predicted else None,
                        op_split=op_time_split(e["timeline"]) if hook and e.get("timeline") else None))
        if hook and timelines is not None and e.get("timeline"):
            timelines[(model, workers, name, rows[-1].codec)] = e["timeline"]
        if predicted is not None and predictions is not None:
            predictions[(model, workers, name, rows[-1].codec)] = predicted
    return rows


def _hook_prediction(entry: dict[str, Any], cluster: Any, profile: Profile | None,
                     say: Callable[[str], None]) -> Any:
    """The simulator's timeline of a hook row's plan from the first hook call (its ``iteration_time`` is the
    predicted span), each bucket ready when the last rank handed it over in the row's last timed iteration (None
    where the row did not say, or the simulation failed: said, and the measured row kept)."""
    if not entry.get("sim_plan") or entry.get("ready_s") is None:
        return None
    try:
        plan = SyncPlan.from_dict(entry["sim_plan"], source="the hook row's plan")
        return simulate(plan, cluster, profile, ready_times=entry["ready_s"])
    except Exception as exc:
        say(f"predicting a hook row failed: {_short(exc)}")
        return None


def _sim_cluster(workers: int, bandwidth_gbps: float):
    from ..sim.costmodel import ClusterModel

    return ClusterModel.for_workers(workers, workers_per_node=1, bandwidth_gbps=bandwidth_gbps)


def _row_key(row: Row) -> dict[str, Any]:
    return {"strategy": row.strategy, "codec": row.codec, "sync_s": row.sync_s}


def _measure_cells(cells, grid: Grid, setup: Setup, rows: list[Row], result: BenchResult, bar, say, *, iters: int,
                   warmup: int, seed: int, profile: Profile | None, head_to_head: int = 0) -> None:
    from ..runtime.ray_layer import ray_session

    with ray_session(setup.ray_address, num_cpus=max(4, setup.cores) if setup.ray_address is None else None):
        current: tuple[str, int] | None = None
        store = exact = None
        for model, workers, strategy, codec in cells:
            if current != (model, workers):
                current = (model, workers)
                if store is not None:
                    store.clear()
                store = GradientStore(model, seed)
                bar.set_description(f"exact mean {model} N={workers}")
                exact = exact_mean(model, workers, seed)
            bar.set_description(f"casync {model} N={workers} {strategy}/{codec_label(codec)}")
            row = Row(model=model, workers=workers, system="casync", strategy=strategy, codec=codec)
            try:
                cluster = setup.cluster_model(workers, grid.compute_threads)
                plan = make_plan(model, workers, strategy, codec, grid.codecs, cluster, seed=seed, profile=profile,
                                 strategies=grid.strategies)
                row.wire_bytes = plan.wire_bytes()
                row.dense_wire_bytes = _dense_wire(plan)
                row.compression = row.dense_wire_bytes / row.wire_bytes if row.wire_bytes else 1.0
                row.plan = plan_choices(plan) if split_transport(strategy)[0] == "auto" else None
                row.predicted_s = predicted_sync_s(predict(plan, cluster, profile))
                run: EngineRun = measure_plan(plan, store, exact, address=setup.ray_address, iters=iters,
                                              transport=split_transport(strategy)[1],
                                              compute_threads=grid.compute_threads,
                                              warmup=warmup, spread=setup.spread_workers,
                                              link_bytes=setup.link_bytes if setup.kind == "netem" else None)
                row.sync_s, row.sync_all_s = run.sync_median_s, run.sync_s
                row.wall_s = sorted(run.wall_s)[len(run.wall_s) // 2]
                row.consistent, row.rel_error, row.tasks = run.consistent, run.rel_error, run.tasks
                row.link_bytes = run.link_bytes
                result.plans[(model, workers, strategy, codec)] = plan
                result.measured_timelines[(model, workers, strategy, codec)] = run.timeline
                row.op_split = op_time_split(run.timeline)
            except Exception as exc:
                row.error = _short(exc)
                say(f"casync {model} N={workers} {strategy}/{codec} failed: {row.error}")
                if os.environ.get("CASYNC_BENCH_DEBUG"):
                    say(traceback.format_exc())
            rows.append(row)
            bar.update(1)
        if store is not None:
            store.clear()
        if head_to_head:
            for model, workers in result.groups():
                _head_to_head(result, setup, model, workers, head_to_head, iters, warmup, seed, bar, say)


#: the baselines a head-to-head re-measures next to the fastest casync configuration
HEAD_TO_HEAD_BASELINES = ("gloo-bucket", "ddp-powersgd-r1", "ddp-powersgd-r4")
#: the PyTorch hooks a head-to-head re-measures next to the fastest "DDP + casync hook" row (the same DDP buckets)
HOOK_HEAD_TO_HEAD_BASELINES = ("ddp", "ddp-powersgd-r1")


def _head_to_head(result: BenchResult, setup: Setup, model: str, workers: int, rounds: int, iters: int, warmup: int,
                  seed: int, bar, say) -> None:
    """Alternate the reference baselines and the fastest casync configuration of a group, ``rounds`` times; where
    the grid has hook rows, the fastest of them and PyTorch's own hooks run in the same rounds' rank processes."""
    best, _ = result.best_worst(model, workers)
    names = tuple(n for n in HEAD_TO_HEAD_BASELINES if n in result.grid.baselines)
    plan = result.plans.get((model, workers, best.strategy, best.codec)) if best else None
    if plan is None or not names:
        bar.update(rounds)
        return
    fastest = result.fastest_hook(model, workers)
    hook = fastest.strategy if fastest is not None else None  # its row name, the key of its times in the rounds
    hook_names = tuple(n for n in HOOK_HEAD_TO_HEAD_BASELINES if n in result.grid.baselines) if hook else ()
    torch_rows = tuple(dict.fromkeys(names + hook_names + ((hook,) if hook_names else ())))
    store = GradientStore(model, seed)
    record: dict[str, Any] = {"casync": best.label, "strategy": best.strategy, "codec": best.codec,
                              "baselines": list(names), "rounds": []}
    if hook_names:
        record.update(hook=hook, hook_baselines=list(hook_names))
    try:
        for r in range(rounds):
            bar.set_description(f"head to head {model} N={workers}, round {r + 1}/{rounds}")
            try:
                raw = run_baselines(setup.launcher(), model, workers, torch_rows, iters=iters, warmup=warmup,
                                    seed=seed, compute_threads=result.grid.compute_threads,
                                    cluster=setup.cluster_model(workers, compute_lanes=result.grid.compute_threads),
                                    profile=result.profile)
                run = measure_plan(plan, store, None, address=setup.ray_address, iters=iters, warmup=warmup,
                                   transport=split_transport(best.strategy)[1],
                                   compute_threads=result.grid.compute_threads,
                                   spread=setup.spread_workers)
            except Exception as exc:
                say(f"head to head {model} N={workers} round {r + 1} failed: {exc}")
                record.setdefault("errors", []).append(_short(exc))
            else:
                record["rounds"].append({**{n: raw[n]["sync_median_s"] for n in torch_rows},
                                         "casync": run.sync_median_s})
            bar.update(1)
    finally:
        store.clear()
    if record["rounds"]:
        record["median_speedup"] = {n: statistics.median(x[n] / x["casync"] for x in record["rounds"]) for n in names}
        if hook_names:
            record["hook_median_speedup"] = {n: statistics.median(x[n] / x[hook] for x in record["rounds"])
                                             for n in hook_names}
    result.head_to_head[f"{model}/{workers}"] = record


def _speedups(rows: list[Row]) -> None:
    """Each casync row's speed-up against the baselines of its (model, workers) group."""
    by_group: dict[tuple[str, int], dict[str, float]] = {}
    for r in rows:
        if r.system == "baseline" and r.ok:
            by_group.setdefault((r.model, r.workers), {})[r.strategy] = r.sync_s
    for r in rows:
        base = by_group.get((r.model, r.workers), {})
        if r.ok:
            r.speedup = {name: t / r.sync_s for name, t in base.items() if name in COMPARE_WITH or name == REFERENCE}
