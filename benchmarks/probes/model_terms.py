"""Which runtime term does the calibrated model get wrong? Measure once, then fit and predict offline (issue #44).

    python benchmarks/probes/model_terms.py measure OUT    # the bench's calibration runs + the quick grid's rows
    python benchmarks/probes/model_terms.py fit OUT        # fit with this checkout's code, predict, compare
    python benchmarks/probes/model_terms.py bench OUT BENCH_JSON   # that fit, against a bench run's casync rows

``measure`` runs, back to back on RayEngine (direct plane), the plans of ``casync bench``'s calibration
(``casync.runtime.machine_profile.QUICK_RECIPE``: synthetic tensors, 2 workers) and the fixed casync rows of
``casync bench --quick`` (ResNet-50, 4 workers), and keeps every step's op records and each actor's process CPU
in ``OUT/runs.pkl`` (with the load average before and after).  ``fit`` fits the runtime from the calibration runs
with the code of this checkout, simulates each row, and prints per row predicted against measured sync, the
bench's fidelity figures, and per op kind and codec the ops' measured CPU against their simulated price — so a
change of the model can be judged on the same measurement, without the minutes and the noise of a new one.
``bench`` predicts the RayEngine rows of a ``casync bench --quick`` report (its ``bench.json``: resnet50, 4 workers)
with that fit instead, against the report's measured syncs (the fidelity over its fixed rows: an ``auto`` row
measured the plan its own run chose).  Answers go to ``benchmarks/results/model_terms/``.
"""
from __future__ import annotations

import os
import pickle
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

ROWS = [(s, c) for s in ("ring", "ps-oneway", "ps-twoway", "allgather")
        for c in ("none", "fp16", "onebit", "randomk:ratio=0.01")]
CODECS = ("none", "fp16", "onebit", "randomk:ratio=0.01")


def _cluster(workers: int):
    from casync.sim.costmodel import ClusterModel

    return ClusterModel(nodes=1, workers_per_node=workers, bandwidth_gbps=10.0, latency_us=50.0,
                        cores_per_node=os.cpu_count())


def measure(out: Path) -> None:
    from casync.bench.predict import make_plan
    from casync.runtime.calibrate import calibration_plans, calibration_tensors, measure_backward_cores, measure_runs
    from casync.runtime.machine_profile import QUICK_RECIPE
    from casync.runtime.ray_layer import connect_ray

    r = QUICK_RECIPE
    calibration = calibration_plans(workers=r["workers"],
                                    tensors=calibration_tensors(r["tensors"], r["smallest"], r["largest"]))
    rows = [make_plan("resnet50", 4, s, c, CODECS, _cluster(4)) for s, c in ROWS]
    load = [os.getloadavg()]
    connect_ray(None, num_cpus=max(4, os.cpu_count() or 1))
    cal = measure_runs(calibration, r["iters"], transport=r["transport"])
    measured = measure_runs(rows, 3, transport="direct")
    load.append(os.getloadavg())
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "runs.pkl", "wb") as f:
        pickle.dump({"calibration": [(p.to_dict(), m.steps, m.process_cpu_s) for p, m in zip(calibration, cal)],
                     "rows": [(s, c, p.to_dict(), m.steps, m.process_cpu_s)
                              for (s, c), p, m in zip(ROWS, rows, measured)],
                     "backward_cores": measure_backward_cores(), "load": load}, f)
    print(f"wrote {out / 'runs.pkl'}; load average before {load[0]}, after {load[1]}")


def _fitted(out: Path) -> tuple[dict, object]:
    """The measurement in ``out`` and the packaged profile with the runtime fitted from its calibration runs."""
    from casync.plan.syncplan import SyncPlan
    from casync.runtime.calibrate import fit_direct_runtime
    from casync.sim.costmodel import Profile

    data = pickle.load(open(out / "runs.pkl", "rb"))
    runs = [(SyncPlan.from_dict(p), steps) for p, steps, _ in data["calibration"]]
    runtime = fit_direct_runtime(runs, Profile.default(), process_cpu=[cpu for *_, cpu in data["calibration"]],
                                 backward_cores=data["backward_cores"])
    print(f"load average while measured: {data['load']}")
    print("fitted:", {k: v for k, v in runtime.to_dict().items() if k != "samples"})
    return data, Profile.default().with_runtime(runtime)


def fit(out: Path) -> None:
    from casync.bench.fidelity import fidelity_text, model_fidelity
    from casync.plan.syncplan import SyncPlan
    from casync.runtime.calibrate import sync_span
    from casync.sim.simulator import simulate

    data, profile = _fitted(out)
    table, per_op = [], defaultdict(lambda: [0.0, 0.0])
    for strategy, codec, p, steps, _ in data["rows"]:
        plan = SyncPlan.from_dict(p)
        timeline = simulate(plan, _cluster(plan.workers), profile)
        measured = statistics.median(sync_span(rows) for rows in steps)
        table.append(SimpleNamespace(model="resnet50", workers=4, label=f"{strategy} / {codec}", system="casync",
                                     ok=True, sync_s=measured, predicted_s=timeline.sync_time()))
        price = {r["node"]: r["end"] - r["start"] for r in timeline.records}
        for rows in steps:
            for r in rows:
                if r["op"] in ("encode", "decode", "merge") and r["node"] in price:
                    a = plan.graph.nodes[r["node"]]
                    kind = per_op[(r["op"], (a.get("codec") or "-").split("(")[0], strategy.split("-")[0])]
                    kind[0] += (r.get("cpu") or 0.0) / len(steps)
                    kind[1] += price[r["node"]] / len(steps)
    for row in table:
        print(f"{row.label:32s} measured {row.sync_s * 1e3:7.1f} ms  predicted {row.predicted_s * 1e3:7.1f} ms  "
              f"pred/meas {row.predicted_s / row.sync_s:5.2f}")
    print("Model fidelity " + fidelity_text(model_fidelity(table)))
    print("ops' CPU per sync, all ranks (ms): op, codec, strategy: measured / simulated price")
    for key, (m, s) in sorted(per_op.items()):
        print(f"  {key}: {m * 1e3:7.1f} / {s * 1e3:7.1f} = {m / s if s else float('nan'):.2f}")


def bench(out: Path, report: Path) -> None:
    import json

    from casync.bench.fidelity import fidelity_text, model_fidelity
    from casync.bench.grid import QUICK
    from casync.bench.predict import make_plan
    from casync.sim.simulator import simulate

    _, profile = _fitted(out)
    table = []
    for r in json.loads(report.read_text())["rows"]:
        if r["system"] != "casync" or r["model"] != "resnet50" or r["workers"] != 4:
            continue
        plan = make_plan("resnet50", 4, r["strategy"], r["codec"], QUICK.codecs, _cluster(4), profile=profile,
                         strategies=QUICK.strategies)
        predicted = simulate(plan, _cluster(4), profile).sync_time()
        chose = sorted({f"{b.strategy}/{b.codec.name}" for b in plan.buckets}) if r["strategy"] == "auto" else ""
        print(f"{r['strategy']:10s} {r['codec'][:12]:12s} measured {r['sync_s'] * 1e3:7.1f} ms  predicted "
              f"{predicted * 1e3:7.1f} ms  pred/meas {predicted / r['sync_s']:5.2f} {chose}")
        if r["strategy"] != "auto":  # an auto row measured the plan its run chose, which may not be this one
            table.append(SimpleNamespace(model="resnet50", workers=4, label=f"{r['strategy']} / {r['codec']}",
                                         system="casync", ok=True, sync_s=r["sync_s"], predicted_s=predicted))
    print("Model fidelity (fixed rows) " + fidelity_text(model_fidelity(table)))


if __name__ == "__main__":
    modes = {"measure": (measure, 3), "fit": (fit, 3), "bench": (bench, 4)}
    if len(sys.argv) < 2 or sys.argv[1] not in modes or len(sys.argv) != modes[sys.argv[1]][1]:
        sys.exit(__doc__)
    modes[sys.argv[1]][0](*map(Path, sys.argv[2:]))
