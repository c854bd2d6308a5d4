"""Write a time-to-accuracy comparison: the table (text and Markdown), the JSON of everything, and two plots."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from ...table import format_table, markdown_table
from ..report import _finite, _json_default
from .configs import FLOOR, REFERENCE

HEADERS = ["configuration", "system", "final {metric} (mean ± sd)", f"Δ vs {REFERENCE}", "time to target s",
           "steps to target", f"× DDP {REFERENCE}", "× fastest PyTorch hook", "wire MB/step", "step ms"]

READING = (
    "**final** = the metric at the last step, mean ± sd over the seeds (rank 0's replica; every replica is the same). "
    f"**Δ** = that mean minus {REFERENCE}'s (uncompressed DDP). **time to target** = training seconds (the steps "
    "only: evaluation passes are left out, alike for every configuration) to the first evaluation point at least as "
    "good as the target, mean over the seeds; a configuration that does not reach it in every seed says how many "
    f"did and gets no time. **× DDP {REFERENCE}** = {REFERENCE}'s time to target ÷ the row's (above 1: sooner); "
    "**× fastest PyTorch hook** = the same against the fastest of PyTorch's hooks (allreduce, fp16, PowerSGD r1/r4) "
    "that reaches the target. **wire MB/step** = what all ranks' sends put on the wire in one step once the "
    "configuration runs as configured (casync: its sends' bytes, counted; PyTorch's hooks: a ring all-reduce of "
    "their payload, 2 (N-1) × payload). **step ms** = training seconds per step. The floor (DDP with a hook that "
    "sends nothing) is timed only: its replicas diverge, so its accuracy means nothing.")


def table(result: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """The table's headers and one row per configuration (see :data:`READING`)."""
    headers = [h.format(metric=result["task"]["metric"]) for h in HEADERS]
    body = []
    for row in result["summary"]:
        wire = row["wire_bytes_per_step"]
        tail = [round(wire / 1e6, 3) if wire is not None else "not reported",
                round(row["step_s"] * 1e3, 1) if row["step_s"] is not None else ""]
        if not row["evaluated"]:
            body.append([row["config"], row["system"], "n/a (replicas diverge)", "", "n/a", "", "", "", *tail])
            continue
        if row["final_mean"] is None and row["seeds"] and len(row["problems"]) == row["seeds"]:
            body.append([row["config"], row["system"], "failed: see below", "", "", "", "", "", *tail])
            continue
        final = "" if row["final_mean"] is None else f"{row['final_mean']:.4f} ± {row['final_sd']:.4f}"
        if len(row["finals"]) < row["seeds"]:
            final += f" ({len(row['finals'])} of {row['seeds']} seeds)"
        body.append([row["config"], row["system"], final,
                     "" if row["delta"] is None else f"{row['delta']:+.4f}", *_time_cells(row),
                     _times(row["x_reference"]), _times(row["x_fastest_hook"]), *tail])
    return headers, body


def _time_cells(row: dict[str, Any]) -> list[Any]:
    time_ = row["time"]
    if time_ is None:
        return ["no target", ""]
    if time_["seconds"] is None:
        return [f"not reached ({time_['reached']} of {time_['seeds']} seeds)", ""]
    return [round(time_["seconds"], 2), round(time_["steps"], 1)]


def _times(x: float | None) -> Any:
    return "" if x is None else round(x, 2)


def text_summary(result: dict[str, Any]) -> str:
    """What the command prints: the target and the table as fixed-width text, then what went wrong."""
    headers, body = table(result)
    lines = [_target_line(result), format_table(headers, body)]
    lines += [f"{row['config']}: {p}" for row in result["summary"] for p in row["problems"]]
    return "\n".join(lines)


def _target_line(result: dict[str, Any]) -> str:
    task, target = result["task"], result["target"]
    way = "higher" if task["higher_is_better"] else "lower"
    value = "none" if target["value"] is None else f"{target['value']:.4f}"
    fastest = next((r["fastest_hook"] for r in result["summary"] if r["fastest_hook"]), None)
    share = result.get("sync_share")
    share = "" if share is None else f"; DDP {REFERENCE}'s sync share (1 - floor step / its step): {share:.0%}"
    return (f"target: {task['metric']} {value} ({way} is better; {target['source']}); fastest PyTorch hook reaching "
            f"it: {fastest or 'none'}{share}")


def render_markdown(result: dict[str, Any], plots: list[str]) -> str:
    task, proto, machine = result["task"], result["protocol"], result["machine"]
    headers, body = table(result)
    where = "emulated cluster" if result["setup"]["kind"] == "netem" else "one machine"
    L = [f"# Time to accuracy: {task['name']} ({where})",
         "", f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} in {result['seconds']:.0f} s at commit "
         f"`{result['commit']}` by", "", f"```\n{result['command']}\n```", "",
         f"Setup: {result['setup']['description']}.", "",
         f"Machine: {machine.get('cores')} cores ({machine.get('cpu')}), load average at start "
         f"{machine.get('loadavg_at_start')}; Python {machine.get('python')}, torch {machine.get('torch')}; "
         f"{machine.get('platform')}.", "",
         f"Task: {task['name']}, {task['metric']} ({'higher' if task['higher_is_better'] else 'lower'} is better), "
         f"learning rate {task['lr']:g} ({task.get('schedule', 'constant')}), batch {task['batch_size']} per rank; {proto['ranks']} ranks, {proto['steps']} "
         f"steps, seeds {', '.join(map(str, proto['seeds']))}, evaluated at steps "
         f"{', '.join(map(str, proto['eval_steps']))}. Data: {_data_line(task)}.", "",
         _target_line(result) + ".", "", markdown_table(headers, body), "", READING, ""]
    problems = [f"- {row['config']}: {p}" for row in result["summary"] for p in row["problems"]]
    if problems:
        L += ["## What went wrong", "", *problems, ""]
    if plots:
        L += ["## Plots", "", *[f"![{p}]({p})" for p in plots], ""]
    return "\n".join(L)


def _data_line(task: dict[str, Any]) -> str:
    manifest = task.get("manifest") or {}
    where = manifest.get("root") or manifest.get("folder") or task.get("data") or "the task's default set"
    parts = [f"`{where}`"]
    if "train_files" in manifest:
        parts.append(f"{len(manifest['train_files'])} training and {len(manifest['valid_files'])} held-out files "
                     f"(Python {manifest.get('python')})")
    elif "train" in manifest:
        parts.append(f"{manifest['train']} training and {manifest['test']} test images")
    if manifest.get("sha256"):
        parts.append(f"sha256 {manifest['sha256'][:16]}…")
    return ", ".join(parts)


def curve(runs: list[dict[str, Any]], x: str) -> list[tuple[float, float, float, float]]:
    """``(x, mean, low, high)`` per evaluation step of one configuration's runs: the metric's mean and its
    spread (min to max) over the seeds, ``x`` the step or the mean training seconds."""
    by_step: dict[int, list[tuple[float, float]]] = {}
    for run in runs:
        for p in run["points"]:
            if p.get("metric") is not None:
                by_step.setdefault(p["step"], []).append((p["seconds"], p["metric"]))
    out = []
    for step in sorted(by_step):
        secs, values = zip(*by_step[step])
        out.append((float(step) if x == "step" else statistics.fmean(secs), statistics.fmean(values),
                    min(values), max(values)))
    return out


def plot(result: dict[str, Any], x: str, path: Path) -> str:
    """The metric against ``x`` (``"step"`` or ``"seconds"``), one line per configuration, the seeds' spread
    shaded, the target dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for i, name in enumerate(n for n in result["configs"] if n != FLOOR):
        pts = curve([r for r in result["runs"] if r["config"] == name], x)
        if not pts:
            continue
        xs, mean, low, high = zip(*pts)
        color = plt.get_cmap("tab20")(i % 20)
        ax.plot(xs, mean, marker=".", color=color, label=name)
        ax.fill_between(xs, low, high, color=color, alpha=0.2, linewidth=0)
    if result["target"]["value"] is not None:
        ax.axhline(result["target"]["value"], color="0.3", linestyle="--", linewidth=1, label="target")
    ax.set_xlabel("step" if x == "step" else "training seconds (evaluation excluded)")
    ax.set_ylabel(result["task"]["metric"])
    ax.set_title(f"{result['task']['name']}: {result['task']['metric']} against "
                 f"{'step' if x == 'step' else 'wall-clock'} ({result['setup']['kind']}, "
                 f"{result['protocol']['ranks']} ranks, seeds' spread shaded)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def write_report(result: dict[str, Any], out: str | Path, stem: str = "tta") -> dict[str, Any]:
    """Write ``<stem>.md``, ``<stem>.json``, ``<stem>_step.png`` and ``<stem>_time.png`` into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plots = [plot(result, "step", out / f"{stem}_step.png"), plot(result, "seconds", out / f"{stem}_time.png")]
    md = out / f"{stem}.md"
    md.write_text(render_markdown(result, [Path(p).name for p in plots]) + "\n")
    js = out / f"{stem}.json"
    js.write_text(json.dumps(_finite(result), indent=1, default=_json_default, allow_nan=False) + "\n")
    return {"markdown": str(md), "json": str(js), "plots": plots}
