"""Simulator validation: predicted sync time against RayEngine's measured one, on this machine.

    python benchmarks/validate_simulator.py [--model resnet50] [--iters 7]
                                            [--out benchmarks/results/simulator_validation]

For each configuration (strategy x codec x 2-4 workers):

1. calibrate: run ``casync.runtime.calibrate.calibration_plans`` (synthetic log-spaced tensors — not the validation
   model — 2 workers, ring and ps with the configuration's codec, then the default calibration's strategies
   and codecs) on RayEngine and fit the runtime's costs (op CPU time in an actor over the profiled one, the
   executor's gap per op, per-hop latency, the data plane's threads' CPU per sync, message and byte) on top
   of the packaged profile;
2. measure ``--model``'s gradients on RayEngine (median sync span over ``--iters`` steps after
   ``measure_timelines``' warm-ups) and simulate the same plan on a one-node ClusterModel with this machine's
   core count, with the calibrated profile and with the uncalibrated one.

Calibration runs right before each measurement because the machine is shared and its load drifts within
minutes.  Writes a Markdown table and the raw numbers as JSON under ``--out``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from tqdm.auto import tqdm

import casync
from casync.engines.memory import WARMUP_SYNCS
from casync.runtime.calibrate import (CALIBRATION_CONFIGS, calibration_plans, fit_direct_runtime, fit_runtime,
                                     measure_dispatch, measure_run, measure_timelines, sync_span)
from casync.runtime.ray_layer import connect_ray
from casync.sim.costmodel import ClusterModel, Profile
from casync.sim.simulator import simulate
from casync.table import format_table, markdown_table
from result_files import write_results

CONFIGS = [
    ("ring", "none", 2), ("ring", "onebit", 4), ("ring", "topk:ratio=0.01", 3),
    ("ps", "none", 4), ("ps", "onebit", 2), ("ps", "fp16", 3),
    ("allgather", "onebit", 4), ("allgather", "topk:ratio=0.01", 2),
]
HEADERS = ["strategy", "codec", "N", "measured ms", "spread ms", "predicted ms", "error", "uncalibrated ms", "error ",
           "runtime fitted just before"]


def _describe(runtime) -> str:
    scales = ", ".join(f"{k} x{v:.1f}" for k, v in sorted(runtime.op_scale.items()))
    if runtime.plane != "objectstore":
        copies = ", ".join(f"{kind} {b * 1e9:.2f} ns/B" for kind, b in runtime.copy_cpu.items())
        message = (f"; CPU per sync {runtime.sync_cpu_s * 1e3:.1f} ms, per message {runtime.message_cpu_s * 1e3:.2f} ms"
                   f" + copies {copies or 'not fitted'}" if runtime.plane == "direct" else "")
        return f"{scales}; per op {runtime.op_gap_s * 1e3:.2f} ms; hop {runtime.hop.a * 1e3:.2f} ms{message}"
    return (f"{scales}; gap {runtime.task_gap_s * 1e3:.1f} ms; hop {runtime.hop.a * 1e3:.1f} ms; "
            f"dispatch {runtime.dispatch_s * 1e3:.2f} ms")


def _fit(measured, base: Profile, cores: int, transport: str):
    """The runtime's costs fitted from calibration runs (``(plan, MeasuredRun)`` pairs) on ``transport``."""
    runs = [(plan, m.steps) for plan, m in measured]
    if transport == "objectstore":
        return fit_runtime(runs, base, cores=cores, dispatch_s=measure_dispatch(iters=10))
    workers = max(p.workers for p, _ in measured)
    return fit_direct_runtime(runs, base, cluster=ClusterModel(nodes=1, workers_per_node=workers, cores_per_node=cores),
                              process_cpu=[m.process_cpu_s for _, m in measured])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--iters", type=int, default=7)
    parser.add_argument("--calibration-iters", type=int, default=4)
    parser.add_argument("--calibration-workers", default="2",
                        help="workers of the calibration plans: a number, or 'same' as the configuration measured")
    parser.add_argument("--profile", default=None, help="micro-benchmark profile JSON (default: the packaged one)")
    parser.add_argument("--transport", default="direct", choices=["direct", "objectstore"],
                        help="RayEngine's data plane, measured and calibrated")
    parser.add_argument("--out", default="benchmarks/results/simulator_validation")
    args = parser.parse_args()
    base = Profile.load(args.profile) if args.profile else Profile.default()
    cores = os.cpu_count() or 1
    connect_ray(None, num_cpus=max(4, cores))
    started = time.time()

    rows, raw = [], []
    for strategy, codec, workers in tqdm(CONFIGS, desc="validating"):
        # calibrate right before each measurement: the machine's load drifts within minutes
        # the codec's ring and ps, then the default calibration's (other strategies and codecs: messages of other
        # sizes and counts, so the data plane's CPU per byte, per message and per sync are told apart)
        cal_workers = workers if args.calibration_workers == "same" else int(args.calibration_workers)
        cal_plans = calibration_plans(workers=cal_workers, configs=list(dict.fromkeys([("ring", codec), ("ps", codec),
                                                                                      *CALIBRATION_CONFIGS])))
        measured_runs = [(p, measure_run(p, args.calibration_iters, transport=args.transport)) for p in cal_plans]
        runtime = _fit(measured_runs, base, cores, args.transport)
        calibrated = base.with_runtime(runtime)
        plan = casync.build_plan(args.model, workers=workers, strategy=strategy, codec=codec)
        spans = [sync_span(rows_) for rows_ in measure_timelines(plan, args.iters, transport=args.transport)]
        measured = statistics.median(spans)
        q1, _, q3 = statistics.quantiles(spans, n=4)
        cluster = ClusterModel(nodes=1, workers_per_node=workers, cores_per_node=cores)
        predicted = simulate(plan, cluster, calibrated).sync_time()
        ideal = simulate(plan, cluster, base).sync_time()
        err, err_ideal = (predicted - measured) / measured, (ideal - measured) / measured
        rows.append([strategy, codec, workers, round(measured * 1e3), f"{q1 * 1e3:.0f}-{q3 * 1e3:.0f}",
                     round(predicted * 1e3), f"{100 * err:+.0f}%", round(ideal * 1e3), f"{100 * err_ideal:+.0f}%",
                     _describe(runtime)])
        raw.append(dict(strategy=strategy, codec=codec, workers=workers, measured_s=measured, spans_s=spans,
                        predicted_s=predicted, rel_error=err, uncalibrated_s=ideal, uncalibrated_rel_error=err_ideal,
                        runtime=runtime.to_dict()))
        tqdm.write(format_table(HEADERS, rows[-1:]))

    cal_text = "as many" if args.calibration_workers == "same" else args.calibration_workers
    within = sum(abs(r["rel_error"]) <= 0.2 for r in raw)
    within_ideal = sum(abs(r["uncalibrated_rel_error"]) <= 0.2 for r in raw)
    text = (f"# Simulator validation ({args.model})\n\nGenerated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} "
            f"in {time.time() - started:.0f} s by\n\n"
            f"```\npython benchmarks/validate_simulator.py --model {args.model} --iters {args.iters} "
            f"--transport {args.transport}"
            + (f" --calibration-workers {args.calibration_workers}" if args.calibration_workers != "2" else "")
            + "\n```\n\n"
            f"Machine: {cores} cores, shared with other jobs (noisy; the load drifts within minutes). Measured: "
            f"RayEngine (transport={args.transport!r}) on an embedded local Ray, median sync span of {args.iters} "
            f"steps after {WARMUP_SYNCS} warm-ups (spread: "
            f"quartiles). Predicted: `casync.simulate` on `ClusterModel(nodes=1, cores_per_node={cores})` with the "
            f"packaged micro-benchmark profile plus the runtime's costs fitted (`casync.runtime.calibrate.fit_runtime`, "
            f"`fit_direct_runtime` for the direct plane) "
            f"from calibration runs measured just before each configuration: synthetic log-spaced tensors (not "
            f"{args.model}), {cal_text} workers, ring and ps with the same codec, then the default calibration's other "
            f"strategies and codecs (`casync.runtime.calibrate.CALIBRATION_CONFIGS`). On the direct plane the "
            f"fit includes the CPU the actors' processes spend beyond their ops (per sync, per message and per "
            f"byte sent), which the simulator charges on the node's cores. Uncalibrated: the micro-benchmark "
            f"profile alone.\n\n"
            + markdown_table(HEADERS, rows)
            + f"\n\n**{within} of {len(raw)} configurations within 20%** with the calibrated runtime "
            f"({within_ideal} of {len(raw)} uncalibrated).\n")
    md = write_results(args.out, "simulator_validation", text, raw)
    print(format_table(HEADERS, rows))
    print(f"{within}/{len(raw)} within 20% (uncalibrated {within_ideal}/{len(raw)}); wrote {md}")


if __name__ == "__main__":
    main()
