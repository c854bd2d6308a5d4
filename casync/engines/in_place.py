"""Which buckets' results an actor may write over its own gradient buffer while the step runs.

A DDP comm hook's natural output is DDP's bucket buffer, which holds the gradient the step reads: writing the
results there instead of into a buffer of their own spares copying every bucket back at the end of the step
(102 MB per rank per ResNet-50 step).  That is safe for a bucket when, on this actor, the last read of each
gradient element comes before the first write of its result, whatever order the executor takes ready ops in.
The plan says so statically (a happened-before relation is a path in its graph):

* no op that writes a partition's result (``output``) reads that partition's gradient itself;
* every op that reads it — and the encode a merge of it is handed to, which reads it later
  (``casync.primitives.merge.PendingMerge``) — is an ancestor of every op that writes the result;
* a payload an encode makes straight from the gradient may be a view of it (codec ``none``), and is read by
  a sender thread after the send op: its arrival (the receive) must be an ancestor of the result's writers too.
"""
from __future__ import annotations

from typing import Any

import networkx as nx

from casync.primitives.merge import handed_to_encode

from ..plan.syncplan import SyncPlan


def results_over_gradients(plan: SyncPlan, actor: str) -> set[str]:
    """The buckets of ``actor`` whose results may be written into the buffer that holds its gradient."""
    graph = plan.graph
    nodes = graph.nodes
    readers: dict[tuple[str, int], list[Any]] = {}
    writers: dict[tuple[str, int], list[Any]] = {}
    for n, a in nodes(data=True):
        if a["actor"] != actor:
            continue
        key = (a["bucket"], a["part"])
        if a.get("local_input"):
            readers.setdefault(key, []).append(n)
            successors = [nodes[v] for v in graph.successors(n)]
            if handed_to_encode(a, successors):
                readers[key].extend(graph.successors(n))
        if a.get("output"):
            writers.setdefault(key, []).append(n)
    ok = {bucket for bucket, _ in writers}
    for key, outs in writers.items():
        reads = readers.get(key, [])
        arrivals = [recv for r in reads if nodes[r]["op"] == "encode" and nodes[r].get("local_input")
                    for send in graph.successors(r) if nodes[send]["op"] == "send"
                    for recv in graph.successors(send)]
        for out in outs:
            before = nx.ancestors(graph, out)
            if not reads or out in reads or not all(r in before for r in reads + arrivals):
                ok.discard(key[0])
    return ok
