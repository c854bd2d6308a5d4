"""Write a comparison's results: a Markdown table, raw JSON and PNG plots (matplotlib, Agg)."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from ..drawing import draw_gantt
from ..table import format_table, markdown_table
from .baselines import BASELINES, DDP_SETTLE_ITERS, NO_COMMUNICATION, REFERENCE
from .fidelity import fidelity_by_group, fidelity_lines
from .grid import codec_label, split_transport, strategy_labels
from .hooks import parse_hook_variant
from .predict import predict
from .runner import BenchResult, Row

MEASURED_DEFINITION = (
    "**sync** = median over the timed iterations of one synchronization's span over all workers: casync, from the "
    "first worker actor's start of the step (gradients already in the actors as zero-copy views; the posting of its "
    "receives and the NaN/Inf scan of its gradient, inside its ops, included) to the last op of any worker "
    "(RayEngine's timeline); gloo, every rank passes a barrier and the span runs from the earliest rank's first "
    "all_reduce call to the latest rank's last division; DDP, from the earliest rank's first bucket hook call to "
    "the latest rank's last bucket's reduced gradient (compression, decompression and error feedback of the hooks "
    "included). **×gloo** = the gloo all_reduce (25 MiB buckets) sync divided by this row's; **wire MB** = bytes "
    "all sends put on the wire in one sync (baselines: a ring all-reduce of the payload, 2(N-1) × payload); **link "
    "MB** (emulated cluster only) = bytes that really crossed the links per sync, from the interface counters "
    "(TCP/IP and Ray or gloo protocol overhead included; casync: all bytes the worker nodes sent minus what the "
    "driver's node received); **ratio** = the same sends uncompressed / wire bytes; **predicted** = the simulator's "
    "sync time for the same plan on the ClusterModel of the setup (DDP + casync hook rows: from the first hook "
    "call, its buckets ready when the last rank handed each over in the row's last timed iteration); **wall** = "
    "casync: run_flat wall time (hands "
    "gradients to the actors, syncs, fetches every worker's result to the driver); DDP: forward+backward wall time; "
    "**rel err** = ||result − exact mean|| / ||exact mean||, casync and gloo rows: after the first sync (before "
    "error feedback has history); DDP rows: after the last timed iteration (the same gradients every iteration, so "
    "error feedback's residuals add to it).")


def _ms(x: float | None) -> Any:
    return "" if x is None or not math.isfinite(x) else round(x * 1e3, 1)


def _mb(x: int) -> Any:
    return round(x / 1e6, 2) if x else ""


def group_table(result: BenchResult, model: str, workers: int) -> tuple[list[str], list[list[Any]]]:
    """Baselines first, then casync rows in grid order; the best casync row is marked ``*``."""
    best, _ = result.best_worst(model, workers)
    headers = ["system", "strategy", "codec", "sync ms", "min ms", "max ms", "×gloo", "wire MB", "ratio",
               "predicted ms", "pred/meas", "wall ms", "consistent", "rel err"]
    body = []
    rows = result.group(model, workers)
    show_link = any(r.link_bytes is not None for r in rows)
    if show_link:
        headers.insert(headers.index("wire MB") + 1, "link MB")
    order = {s: i for i, s in enumerate(strategy_labels())}
    codecs = list(result.grid.codecs)
    casync = sorted((r for r in rows if r.system == "casync"),  # by strategy (ring, ring.p8, ring@tcp), then codec
                    key=lambda r: (order.get(split_transport(r.strategy)[0].partition(".")[0], 99), r.strategy,
                                   codecs.index(r.codec) if r.codec in codecs else 99))
    for r in [r for r in rows if r.system == "baseline"] + [r for r in rows if r.system == "hook"] + casync:
        if r.error:
            body.append([_system_cell(r), _strategy_cell(r), _codec_cell(r),
                         "failed: " + r.error] + [""] * (len(headers) - 4))
            continue
        pred = r.predicted_s
        link = [_mb(r.link_bytes) if r.link_bytes is not None else ""] if show_link else []
        body.append([
            _system_cell(r), _strategy_cell(r) + (" *" if r is best else ""), _codec_cell(r), _ms(r.sync_s),
            _ms(min(r.sync_all_s)), _ms(max(r.sync_all_s)),
            round(r.speedup[REFERENCE], 2) if REFERENCE in r.speedup else "",
            _mb(r.wire_bytes), *link, round(r.compression, 1) if r.wire_bytes else "",
            _ms(pred), round(pred / r.sync_s, 2) if pred else "", _ms(r.wall_s),
            "n/a" if r.strategy == NO_COMMUNICATION else "yes" if r.consistent else "NO",
            "" if r.rel_error is None else float(f"{r.rel_error:.3g}")])
    return headers, body


def _system_cell(r: Row) -> str:
    if r.system in ("casync", "hook"):
        return "casync" if r.system == "casync" else "DDP + casync"
    return "torch DDP" if r.strategy.startswith("ddp") else "torch gloo"


def _strategy_cell(r: Row) -> str:
    if r.system == "hook":
        return f"comm hook: {parse_hook_variant(r.strategy)[0]}"
    if r.system == "baseline":
        return {"gloo-tensor": "all_reduce per tensor", "gloo-bucket": "all_reduce 25 MiB buckets",
                "ddp": "DDP allreduce_hook", "ddp-fp16": "DDP fp16_compress_hook",
                "ddp-powersgd-r1": "DDP powerSGD_hook r1", "ddp-powersgd-r4": "DDP powerSGD_hook r4",
                NO_COMMUNICATION: "DDP, hook without communication (floor)"}[r.strategy]
    return r.strategy


def _codec_cell(r: Row) -> str:
    return r.codec if r.system == "baseline" else r.codec_cell


def summary_table(result: BenchResult) -> tuple[list[str], list[list[Any]]]:
    headers = ["model", "N", "best casync", "sync ms", "gloo 25 MiB ms", "×gloo", "PowerSGD r1 ms", "×PowerSGD r1",
               "PowerSGD r4 ms", "×PowerSGD r4", "predicted ms"]
    body = []
    for model, workers in result.groups():
        best, _ = result.best_worst(model, workers)
        base = {r.strategy: r for r in result.group(model, workers) if r.system == "baseline" and r.ok}
        if best is None:
            continue

        def cell(name: str) -> tuple[Any, Any]:
            b = base.get(name)
            return (_ms(b.sync_s), round(b.sync_s / best.sync_s, 2)) if b else ("", "")

        g, p1, p4 = cell("gloo-bucket"), cell("ddp-powersgd-r1"), cell("ddp-powersgd-r4")
        body.append([model, workers, best.label, _ms(best.sync_s), *g, *p1, *p4, _ms(best.predicted_s)])
    return headers, body


#: PyTorch's own DDP hooks the "DDP + casync hook" rows are compared with
TORCH_HOOKS = ("ddp", "ddp-fp16", "ddp-powersgd-r1", "ddp-powersgd-r4")


def hook_table(result: BenchResult) -> tuple[list[str], list[list[Any]]]:
    """Per group: the fastest casync configuration through DDP's comm hook against PyTorch's own hooks, and,
    where it ran, the floor no hook goes below (DDP with a hook that communicates nothing) with the largest
    speed-up over DDP's allreduce that floor leaves to any hook."""
    floor_ran = any(r.strategy == NO_COMMUNICATION and r.system == "baseline" and r.ok for r in result.rows)
    headers = ["model", "N", "fastest DDP + casync hook", "sync ms"]
    for name in TORCH_HOOKS:
        headers += [f"{BASELINES[name]} ms", "×"]
    if floor_ran:
        headers += ["no-communication floor ms", "DDP allreduce_hook ÷ floor"]
    body = []
    for model, workers in result.groups():
        group = result.group(model, workers)
        best = result.fastest_hook(model, workers)
        if best is None:
            continue
        base = {r.strategy: r for r in group if r.system == "baseline" and r.ok}
        row: list[Any] = [model, workers, best.label, _ms(best.sync_s)]
        for name in TORCH_HOOKS:
            b = base.get(name)
            row += [_ms(b.sync_s), round(b.sync_s / best.sync_s, 2)] if b else ["", ""]
        if floor_ran:
            floor, ddp = base.get(NO_COMMUNICATION), base.get("ddp")
            row += [_ms(floor.sync_s) if floor else "", round(ddp.sync_s / floor.sync_s, 2) if floor and ddp else ""]
        body.append(row)
    return headers, body


def op_time_table(result: BenchResult) -> tuple[list[str], list[list[Any]]]:
    """Per casync and hook row whose timeline says: where one rank's ops' wall time went in the measured
    iteration (:func:`~casync.engines.timeline.op_time_split`), so a rank short of cores shows apart from one
    short of the GIL."""
    headers = ["model", "N", "configuration", "ops per rank", "ops' wall ms", "own CPU ms", "waiting for a core ms",
               "blocked (GIL) ms", "blocked share"]
    body = []
    for r in result.rows:
        split = r.op_split if r.ok else None
        if split is None:
            continue
        body.append([r.model, r.workers, r.label if r.system == "hook" else f"casync {r.label}", round(split["ops"]),
                     _ms(split["wall"]), _ms(split["cpu"]), _ms(split["queued"]), _ms(split["blocked"]),
                     f"{split['blocked'] / split['wall']:.0%}" if split["wall"] else ""])
    return headers, body


def head_to_head_table(result: BenchResult) -> tuple[list[str], list[list[Any]]]:
    """Per group and round: the reference baselines' and the fastest casync configuration's sync times."""
    headers, body = [], []
    for key, rec in result.head_to_head.items():
        names = rec["baselines"]
        headers = ["model/N", "round", "casync configuration"] + [f"{BASELINES[n]} ms" for n in names] + \
            ["casync ms"] + [f"×{BASELINES[n]}" for n in names]
        for i, x in enumerate(rec["rounds"], 1):
            body.append([key, i, rec["casync"]] + [_ms(x[n]) for n in names] + [_ms(x["casync"])]
                        + [round(x[n] / x["casync"], 2) for n in names])
        if rec.get("median_speedup"):
            body.append([key, "median", rec["casync"]] + [""] * (len(names) + 1)
                        + [round(rec["median_speedup"][n], 2) for n in names])
    return headers, body


def hook_head_to_head_table(result: BenchResult) -> tuple[list[str], list[list[Any]]]:
    """Per group and round: PyTorch's DDP hooks and the fastest "DDP + casync hook" row, from the same rounds."""
    headers, body = [], []
    for key, rec in result.head_to_head.items():
        if not rec.get("hook_baselines"):
            continue
        names, hook = rec["hook_baselines"], rec["hook"]
        label, codec = parse_hook_variant(hook)
        config = f"{label} / {codec_label(codec)}"
        headers = ["model/N", "round", "casync hook"] + [f"{BASELINES[n]} ms" for n in names] + \
            ["casync hook ms"] + [f"×{BASELINES[n]}" for n in names]
        for i, x in enumerate(rec["rounds"], 1):
            body.append([key, i, config] + [_ms(x[n]) for n in names] + [_ms(x[hook])]
                        + [round(x[n] / x[hook], 2) for n in names])
        if rec.get("hook_median_speedup"):
            body.append([key, "median", config] + [""] * (len(names) + 1)
                        + [round(rec["hook_median_speedup"][n], 2) for n in names])
    return headers, body


def sim_tables(result: BenchResult) -> dict[str, tuple[list[str], list[list[Any]]]]:
    """Per model: rows strategy/codec, columns (N, Gbps), predicted sync ms; ``*`` marks each column's best."""
    out = {}
    models = list(dict.fromkeys(r.model for r in result.sim_rows))
    for model in models:
        mine = [r for r in result.sim_rows if r.model == model]
        cols = list(dict.fromkeys((r.workers, r.bandwidth_gbps) for r in mine))
        cells = list(dict.fromkeys((r.strategy, r.codec) for r in mine))
        value = {(r.strategy, r.codec, r.workers, r.bandwidth_gbps): r.predicted_s for r in mine}
        best = {c: min((value.get((s, k, *c), math.inf) for s, k in cells), default=math.inf) for c in cols}
        headers = ["strategy", "codec"] + [f"N={n} {bw:g}G" for n, bw in cols]
        body = []
        for s, k in cells:
            row: list[Any] = [s, codec_label(k)]
            for c in cols:
                v = value.get((s, k, *c), math.nan)
                row.append("" if not math.isfinite(v) else f"{v * 1e3:.1f}" + (" *" if v == best[c] else ""))
            body.append(row)
        out[model] = (headers, body)
    return out


def render_markdown(result: BenchResult, plots: list[str]) -> str:
    s = result.setup
    m = result.machine
    L = [f"# casync strategy comparison ({'emulated cluster' if s.kind == 'netem' else 'one machine'})", ""]
    L += [f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} in {result.seconds:.0f} s by", "",
          f"```\n{result.command}\n```", ""]
    L += [f"Setup: {s.describe()}. Simulator's model of it: `{s.cluster_model(min(max(result.grid.workers), s.nodes) if s.kind == 'netem' else max(result.grid.workers), result.grid.compute_threads)}`"
          f" (per worker count). " + " ".join(f"{k}: {v}." for k, v in s.notes.items() if k.startswith("measured_")), ""]
    L += [f"Machine: {m.get('cores')} cores ({m.get('cpu')}), load average at start {m.get('loadavg_at_start')}; "
          f"Python {m.get('python')}, NumPy {m.get('numpy')}, torch {m.get('torch')}, Ray {m.get('ray')}; "
          f"{m.get('platform')}. A shared machine: timings move by tens of percent between runs; ratios are "
          "from this one run, side by side.", ""]
    L += [f"Gradients: every system syncs the same tensors (worker w: standard normal, seeded by (seed, w)), "
          f"mean over workers; {result.warmup} warm-up + {result.iters} timed iterations per configuration; each "
          "casync configuration runs on a fresh RayEngine; DDP rows (PyTorch's hooks and casync's) run "
          f"{DDP_SETTLE_ITERS} more warm-up iterations after their hook's own start, to be timed in steady state. "
          "Baselines: " +
          ", ".join(BASELINES[b] for b in result.grid.baselines) + "; through DDP's comm hook: " +
          (", ".join(r.label for r in result.rows if r.system == "hook" and r.model == result.rows[0].model
                     and r.workers == result.rows[0].workers) or "none") + ".", ""]
    L += [MEASURED_DEFINITION + f" Predictions use {result.predicted_with}.", ""]
    first, *groups = fidelity_lines(fidelity_by_group(result.rows))
    L += [f"**Model.** Predictions use {result.predicted_with}. {first}", *groups, ""]
    headers, body = summary_table(result)
    if body:
        L += ["## Best casync configuration against the baselines", "", markdown_table(headers, body), ""]
    headers, body = hook_table(result)
    if body:
        L += ["## DDP + casync hook against PyTorch's DDP hooks", "",
              "The same casync configurations through `casync.torch.comm_hook` on a DistributedDataParallel model "
              "(DDP's 25 MiB buckets), timed like the DDP baselines in the same rank processes: from the first "
              "bucket's hook call to the last bucket's synchronized result; `×` = that hook's sync time / the "
              "fastest casync hook row's. The *no-communication floor* is the same span with a hook that sends "
              "nothing: the later buckets' backward and DDP's own copies, which every DDP row's span holds; "
              "DDP allreduce_hook ÷ floor is the largest speed-up over DDP's allreduce any hook could show here.",
              "", markdown_table(headers, body), ""]
    headers, body = head_to_head_table(result)
    if body:
        L += ["## Head to head", "",
              "After the grid, the fastest casync configuration and the reference baselines measured again, "
              "alternating round by round (each entry: the median sync of "
              f"{result.iters} timed iterations), so that each ratio compares runs minutes apart on this shared "
              "machine.", "", markdown_table(headers, body), ""]
    headers, body = hook_head_to_head_table(result)
    if body:
        L += ["### DDP + casync hook, head to head", "",
              "In the same rounds and rank processes: the fastest DDP + casync hook row and PyTorch's own DDP "
              "hooks, so that the hook's ratios, too, compare runs minutes apart.", "",
              markdown_table(headers, body), ""]
    for model, workers in result.groups():
        L += [f"## {model}, {workers} workers", ""]
        headers, body = group_table(result, model, workers)
        L += [markdown_table(headers, body), "", "`*` the fastest casync configuration. auto rows: the codec "
              "candidates → what the planner chose per bucket.", ""]
    headers, body = op_time_table(result)
    if body:
        L += ["## Where each rank's op time went", "",
              "One rank's encodes, decodes, merges and sends in the measured iteration (casync rows: the median one; "
              "hook rows: the last timed one), summed and averaged over the ranks: their wall time is the ops' own "
              "CPU, plus waiting runnable for a core (Linux schedstat), plus blocked, which in ops that take no "
              "lock is waiting for the GIL (the rank's other compute threads, its receive and send lanes, and in "
              "hook rows the training script's own threads hold it).", "", markdown_table(headers, body), ""]
    tables = sim_tables(result)
    if tables:
        L += ["## Simulated grid", "",
              "Predicted sync time (ms) of the same strategies and codecs on ClusterModel(nodes=N, "
              f"workers_per_node=1, bandwidth as given, latency 50 us) with {result.sim_predicted_with}: the full "
              "plan's simulation (computed from its compact template where that is exact); `*` marks the best "
              "of each column.", ""]
        for model, (headers, body) in tables.items():
            L += [f"### {model}", "", markdown_table(headers, body), ""]
    if result.failures:
        L += ["## Failures", ""] + [f"- {getattr(r, 'model', '')} {getattr(r, 'workers', '')} "
                                    f"{getattr(r, 'strategy', '')} {getattr(r, 'codec', '')}: {r.error}"
                                    for r in result.failures] + [""]
    if plots:
        L += ["## Plots", ""] + [f"- [{p}]({p})" for p in plots] + [""]
    return "\n".join(L)


def text_summary(result: BenchResult) -> str:
    """What the CLI prints: the per-group tables as fixed-width text."""
    out = [f"predictions: {result.predicted_with}", *fidelity_lines(fidelity_by_group(result.rows)), ""]
    headers, body = summary_table(result)
    if body:
        out += ["best casync configuration against the baselines:", format_table(headers, body), ""]
    for model, workers in result.groups():
        headers, body = group_table(result, model, workers)
        out += [f"{model}, {workers} workers ({result.setup.kind}):", format_table(headers, body), ""]
    headers, body = hook_table(result)
    if body:
        out += ["DDP + casync hook against PyTorch's DDP hooks:", format_table(headers, body), ""]
    headers, body = head_to_head_table(result)
    if body:
        out += ["head to head (interleaved re-measurement):", format_table(headers, body), ""]
    headers, body = hook_head_to_head_table(result)
    if body:
        out += ["DDP + casync hook, head to head:", format_table(headers, body), ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------------------------

def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def plot_bars(result: BenchResult, model: str, path: Path) -> str:
    """Grouped bars: one group per strategy, one bar per codec; baselines as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worker_counts = [w for m, w in result.groups() if m == model]
    fig, axes = plt.subplots(1, len(worker_counts), figsize=(7 * len(worker_counts), 4.8), squeeze=False)
    codecs = list(result.grid.codecs) + ["auto"]
    colors = plt.get_cmap("tab10")
    for ax, workers in zip(axes[0], worker_counts):
        rows = [r for r in result.group(model, workers) if r.ok]
        strategies = list(dict.fromkeys(r.strategy for r in rows if r.system == "casync"))
        width = 0.8 / max(1, len(codecs))
        for j, codec in enumerate(codecs):
            xs, ys = [], []
            for i, s in enumerate(strategies):
                hit = [r for r in rows if r.system == "casync" and r.strategy == s and r.codec == codec]
                if hit:
                    xs.append(i - 0.4 + width * (j + 0.5))
                    ys.append(hit[0].sync_s * 1e3)
            if xs:
                ax.bar(xs, ys, width, label=codec_label(codec), color=colors(j))
        styles = ["--", ":", "-.", (0, (5, 1)), (0, (1, 1)), (0, (3, 1, 1, 1))]
        for k, r in enumerate(r for r in rows if r.system == "baseline"):
            ax.axhline(r.sync_s * 1e3, color="0.25", linestyle=styles[k % len(styles)], linewidth=1,
                       label=BASELINES[r.strategy])
        ax.set_xticks(range(len(strategies)), strategies)
        ax.set_yscale("log")
        ax.set_ylabel("sync time (ms, log)")
        ax.set_title(f"{model}, {workers} workers ({result.setup.kind})", fontsize=10)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def plot_sim(result: BenchResult, model: str, path: Path) -> str:
    """Predicted sync time against bandwidth, one panel per worker count: each strategy's best codec, and
    ring without compression for reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = [r for r in result.sim_rows if r.model == model and math.isfinite(r.predicted_s)]
    worker_counts = sorted({r.workers for r in mine})
    fig, axes = plt.subplots(1, len(worker_counts), figsize=(5 * len(worker_counts), 4), squeeze=False)
    for ax, workers in zip(axes[0], worker_counts):
        rows = [r for r in mine if r.workers == workers]
        bws = sorted({r.bandwidth_gbps for r in rows})
        for s in dict.fromkeys(r.strategy for r in rows):  # the grid's labels (ring.p8 too), in its order
            pts = []
            for bw in bws:
                cand = [r for r in rows if r.strategy == s and r.bandwidth_gbps == bw]
                if cand:
                    pts.append((bw, min(r.predicted_s for r in cand) * 1e3))
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"{s} (best codec)")
        ref = [(r.bandwidth_gbps, r.predicted_s * 1e3) for r in rows if r.strategy == "ring" and r.codec == "none"]
        if ref:
            ax.plot(*zip(*sorted(ref)), color="0.3", linestyle="--", label="ring, no compression")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("link bandwidth (Gbps)")
        ax.set_ylabel("predicted sync (ms)")
        ax.set_title(f"{model}, {workers} workers (simulated)", fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def plot_gantts(result: BenchResult, model: str, workers: int, out: Path) -> list[str]:
    """Measured (RayEngine timeline) and predicted (simulator) Gantt charts of the best and worst cell, and both
    of the fastest DDP + casync hook row (its prediction with the buckets ready when DDP handed them over)."""
    best, worst = result.best_worst(model, workers)
    paths = []
    for which, row in (("best", best), ("worst", worst)):
        if row is None:
            continue
        key = (model, workers, row.strategy, row.codec)
        stem = f"gantt_{_safe(model)}_N{workers}_{which}"
        records = result.measured_timelines.get(key)
        if records:
            paths.append(draw_gantt(records, str(out / f"{stem}_measured.png"),
                                    title=f"measured ({result.setup.kind}): {model}, {workers} workers, {row.label}: "
                                          f"sync {row.sync_s * 1e3:.1f} ms ({which} casync configuration)"))
        plan = result.plans.get(key)
        if plan is not None:
            timeline = predict(plan, result.setup.cluster_model(workers, result.grid.compute_threads), result.profile)
            paths.append(timeline.draw(str(out / f"{stem}_predicted.png"),
                                       title=f"predicted: {model}, {workers} workers, {row.label}: sync "
                                             f"{timeline.sync_time() * 1e3:.1f} ms ({which} casync configuration)"))
    hook = result.fastest_hook(model, workers)
    key = (model, workers, hook.strategy, hook.codec) if hook else None
    records = result.measured_timelines.get(key) if hook else None
    if records:
        paths.append(draw_gantt(records, str(out / f"gantt_{_safe(model)}_N{workers}_hook_measured.png"),
                                title=f"measured ({result.setup.kind}): {model}, {workers} workers, {hook.label}: sync "
                                      f"{hook.sync_s * 1e3:.1f} ms, its last timed iteration (backward: DDP still "
                                      "handing buckets over)"))
    predicted = result.hook_predictions.get(key) if hook else None
    if predicted is not None:
        paths.append(predicted.draw(str(out / f"gantt_{_safe(model)}_N{workers}_hook_predicted.png"),
                                    title=f"predicted: {model}, {workers} workers, {hook.label}: sync "
                                          f"{predicted.iteration_time * 1e3:.1f} ms from the first hook call, each "
                                          "bucket ready when DDP handed it over"))
    return paths


def write_report(result: BenchResult, out: str | Path, stem: str = "bench") -> dict[str, Any]:
    """Write ``<stem>.md``, ``<stem>.json`` and the PNGs into ``out``; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plots: list[str] = []
    for model in dict.fromkeys(m for m, _ in result.groups()):
        if any(r.ok for r in result.rows if r.model == model):
            plots.append(plot_bars(result, model, out / f"{stem}_bars_{_safe(model)}.png"))
    for model, workers in result.groups():
        plots += plot_gantts(result, model, workers, out)
    for model in dict.fromkeys(r.model for r in result.sim_rows):
        plots.append(plot_sim(result, model, out / f"{stem}_sim_{_safe(model)}.png"))
    rel = [str(Path(p).relative_to(out)) for p in plots]
    md = out / f"{stem}.md"
    md.write_text(render_markdown(result, rel) + "\n")
    js = out / f"{stem}.json"
    js.write_text(json.dumps(_finite(result.to_json()), indent=1, default=_json_default, allow_nan=False) + "\n")
    return {"markdown": str(md), "json": str(js), "plots": plots}


def _finite(value: Any) -> Any:
    """NaN and infinities become null (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, tuple):
        return list(value)
    return str(value)
