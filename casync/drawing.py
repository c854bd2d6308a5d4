"""Pictures of plans: Graphviz DOT text and a matplotlib swim-lane PNG (one lane per actor)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import networkx as nx

if TYPE_CHECKING:
    from .plan.syncplan import SyncPlan

OP_COLORS = {"encode": "#4C72B0", "decode": "#55A868", "merge": "#C44E52", "send": "#8172B2", "recv": "#CCB974"}


def _subgraph(plan: "SyncPlan", bucket: str | None) -> nx.DiGraph:
    if bucket is None:
        return plan.graph
    if not any(b.name == bucket for b in plan.buckets):
        raise ValueError(f"no bucket named {bucket!r}; buckets: {[b.name for b in plan.buckets][:10]}")
    return plan.graph.subgraph(list(plan.nodes(bucket=bucket)))


def _quote(text: str) -> str:
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


def plan_to_dot(plan: "SyncPlan", bucket: str | None = None) -> str:
    """DOT text: a cluster per actor, nodes coloured by primitive, send->recv edges dashed."""
    graph = _subgraph(plan, bucket)
    lines = ["digraph syncplan {", "  rankdir=LR;", '  node [shape=box, style="rounded,filled", fontsize=9];']
    by_actor: dict[str, list[str]] = {}
    for node, actor in graph.nodes(data="actor"):
        by_actor.setdefault(actor, []).append(node)
    for i, actor in enumerate(sorted(by_actor)):
        lines.append(f"  subgraph cluster_{i} {{")
        lines.append(f"    label={_quote(actor)};")
        for node in by_actor[actor]:
            a = graph.nodes[node]
            label = f"{a['op']}\\n{a['bucket']} p{a['part']}"
            lines.append(f"    {_quote(node)} [label={_quote(label)}, fillcolor={_quote(OP_COLORS[a['op']])}];")
        lines.append("  }")
    for u, v in graph.edges:
        style = " [style=dashed]" if graph.nodes[u]["op"] == "send" else ""
        lines.append(f"  {_quote(u)} -> {_quote(v)}{style};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def draw_plan(plan: "SyncPlan", path: str, bucket: str | None = None, max_nodes: int = 400) -> str:
    """Write a PNG: x = dependency depth, y = actor lane; large plans are cut to the first buckets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    graph = _subgraph(plan, bucket)
    shown = graph
    if graph.number_of_nodes() > max_nodes:
        keep: list[str] = []
        for b in plan.buckets:
            nodes = [n for n in graph.nodes if graph.nodes[n]["bucket"] == b.name]
            if keep and len(keep) + len(nodes) > max_nodes:
                break
            keep += nodes
        shown = graph.subgraph(keep)
    actors = [a for a in plan.actors if any(shown.nodes[n]["actor"] == a for n in shown.nodes)]
    lane = {a: i for i, a in enumerate(actors)}
    depth: dict[str, int] = {}
    for node in nx.topological_sort(shown):
        depth[node] = max((depth[u] + 1 for u in shown.predecessors(node)), default=0)
    slots: dict[tuple[int, int], int] = {}
    pos = {}
    for node in sorted(shown.nodes, key=lambda n: (depth[n], n)):
        key = (depth[node], lane[shown.nodes[node]["actor"]])
        k = slots.get(key, 0)
        slots[key] = k + 1
        pos[node] = (depth[node], lane[shown.nodes[node]["actor"]] + 0.18 * k)
    width = max(6.0, min(40.0, 0.5 * (max(depth.values(), default=0) + 2)))
    fig, ax = plt.subplots(figsize=(width, max(2.5, 0.8 * len(actors) + 1)))
    for u, v in shown.edges:
        (x0, y0), (x1, y1) = pos[u], pos[v]
        cross = shown.nodes[u]["op"] == "send"
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                    arrowprops=dict(arrowstyle="->", lw=0.6, color="0.4", linestyle="--" if cross else "-"))
    for op, color in OP_COLORS.items():
        pts = [pos[n] for n in shown.nodes if shown.nodes[n]["op"] == op]
        if pts:
            xs, ys = zip(*pts)
            ax.scatter(xs, ys, s=40, color=color, label=op, zorder=3, edgecolors="k", linewidths=0.3)
    ax.set_yticks(range(len(actors)), actors)
    ax.invert_yaxis()
    ax.set_xlabel("dependency depth")
    cut = "" if shown is graph else f" (first {shown.number_of_nodes()} of {graph.number_of_nodes()} ops)"
    ax.set_title(f"{plan!r}{cut}", fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw_gantt(records: list[dict], path: str, title: str = "", actors: list[str] | None = None) -> str:
    """Gantt chart PNG of op records (``op, actor, start, end``): one lane per actor, colour by primitive.

    Used for both the Ray engine's measured timeline and the simulator's predicted one.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    lanes = actors or sorted({r["actor"] for r in records},
                             key=lambda a: (not a.startswith("worker"), a.split(":")[0], int(a.split(":")[1])))
    index = {a: i for i, a in enumerate(lanes)}
    compute = {"forward": "#DDDDDD", "backward": "#F0A040", "update": "#777777"}  # a Trainer's, drawn underneath
    colors = dict(compute, **OP_COLORS, load="#999999")
    fig, ax = plt.subplots(figsize=(12, max(2.5, 0.6 * len(lanes) + 1)))
    bars: dict[tuple[str, int], list[tuple[float, float]]] = {}  # one collection per (op, lane), not per op:
    for r in records:  # a 16-worker plan has tens of thousands of ops, and an artist each took minutes
        if r["op"] in colors:
            bars.setdefault((r["op"], index[r["actor"]]), []).append(
                (r["start"] * 1e3, max(r["end"] - r["start"], 1e-6) * 1e3))
    for op in colors:
        height = 0.35 if op in ("send", "recv") else (0.9 if op in compute else 0.7)
        offset = 0.2 if op == "recv" else (-0.2 if op == "send" else 0.0)
        for y in range(len(lanes)):
            if (op, y) in bars:
                ax.broken_barh(bars[(op, y)], (y - height / 2 + offset, height), facecolors=colors[op],
                               alpha=0.55 if op in ("send", "recv") else (0.5 if op in compute else 0.9))
    ax.set_yticks(range(len(lanes)), lanes)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title, fontsize=9)
    present = {r["op"] for r in records}
    ax.legend(handles=[Patch(color=c, label=o) for o, c in colors.items() if o in present or o in OP_COLORS],
              loc="upper left",
              bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
