"""Command line of the comparison, shared by ``casync bench`` and ``benchmarks/compare_strategies.py``."""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Callable

from ..engines.memory import WARMUP_SYNCS
from .baselines import BASELINES
from .grid import FULL, QUICK, Grid, strategy_labels


def _list(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in _list(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in _list(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true",
                      help="the quick subset (ResNet-50, 4 workers, 4 codecs; about 4-5 minutes on 2 cores)")
    size.add_argument("--full", action="store_true", help="the full grid (the default; hours on 2 cores)")
    p.add_argument("--models", "--model", type=_list, default=None,
                   help=f"comma-separated built-in models (full: {','.join(FULL.models)})")
    p.add_argument("--workers", type=_ints, default=None, help="comma-separated worker counts (full: 2,4)")
    p.add_argument("--strategies", type=_list, default=None,
                   help=f"comma-separated strategy labels: {','.join(strategy_labels())}; a fixed one may "
                        "take a partition count per bucket (ring.p8)")
    p.add_argument("--transports", type=_list, default=None,
                   help="comma-separated RayEngine data planes the measured rows run on (direct, the default; tcp; gloo; objectstore); each row is labelled strategy@transport")
    p.add_argument("--compute-threads", type=int, default=None, metavar="N",
                   help="ops each casync worker (RayEngine's actors and the DDP hook's ranks) runs at once "
                        "(compute_threads; default 1): more where every worker has cores of its own")
    p.add_argument("--codecs", type=_list, default=None, help=f"comma-separated codec specs (full: {','.join(FULL.codecs)})")
    p.add_argument("--baselines", type=_list, default=None,
                   help=f"comma-separated baselines ({','.join(BASELINES)}), or 'none'")
    p.add_argument("--hooks", type=_list, default=None,
                   help="'DDP + casync hook' rows: comma-separated strategy/codec (ring/onebit, ring.p8/onebit; "
                        "auto/onebit: the planner per DDP bucket, for this setup's cluster), 'all' (every measured "
                        "strategy but auto x every codec; the full grid's default) or 'none'")
    p.add_argument("--sim-workers", type=_ints, default=None, help="simulated worker counts (full: 8,16,64)")
    p.add_argument("--sim-bandwidths", type=_floats, default=None, help="simulated link Gbps (full: 1,10,25,100)")
    p.add_argument("--sim-models", type=_list, default=None, help="simulated models (default: the measured ones)")
    p.add_argument("--no-sim", action="store_true", help="skip the simulated grid")
    p.add_argument("--iters", type=int, default=3, help="timed iterations per configuration")
    p.add_argument("--warmup", type=int, default=WARMUP_SYNCS,
                   help="untimed iterations before them (default: until casync's actors allocate nothing new)")
    p.add_argument("--head-to-head", type=int, default=0, metavar="ROUNDS",
                   help="afterwards, re-measure the fastest casync configuration and the gloo/PowerSGD baselines "
                        "alternately for ROUNDS rounds (ratios under the same machine load); with --hooks, the "
                        "fastest hook row and DDP's allreduce/PowerSGD r1 hooks in the same rounds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", default=None, metavar="JSON",
                   help="profile for the predictions of measured rows and for auto's planning (e.g. one from "
                        "`casync profile --calibrate-ray`); wins over calibration; default: the packaged one with "
                        "this machine's calibrated runtime")
    cal = p.add_mutually_exclusive_group()
    cal.add_argument("--no-calibrate", action="store_true",
                     help="predict and plan with the packaged profile as it is, without calibrating this machine "
                          "(by default a short calibration, about 20 s, cached per machine and casync version)")
    cal.add_argument("--recalibrate", action="store_true",
                     help="calibrate this machine now even if a calibration is cached (and cache the new one)")
    p.add_argument("--address", default=None, help="Ray cluster to join (default: an embedded local Ray)")
    p.add_argument("--netem", default=None, metavar="LINKS_ENV",
                   help="run on the emulated cluster of benchmarks/netem (its links.env); see benchmarks/netem")
    p.add_argument("--out", default=None, help="directory for the table (bench.md), raw JSON and PNG plots")
    p.add_argument("--no-progress", action="store_true")


def grid_from_args(args: argparse.Namespace) -> Grid:
    grid = QUICK if args.quick else FULL
    changes = {}
    for field, value in (("models", args.models), ("workers", args.workers), ("strategies", args.strategies),
                         ("codecs", args.codecs), ("transports", args.transports), ("sim_workers", args.sim_workers),
                         ("sim_bandwidths_gbps", args.sim_bandwidths), ("sim_models", args.sim_models),
                         ("compute_threads", args.compute_threads)):
        if value is not None:
            changes[field] = value
    if args.baselines is not None:
        changes["baselines"] = () if args.baselines == ("none",) else args.baselines
    if args.hooks is not None:
        changes["hooks"] = () if args.hooks == ("none",) else args.hooks
    return grid.with_(**changes)


def run(args: argparse.Namespace, prog: str = "casync bench") -> int:
    """Run the comparison the arguments describe; print the tables; exit 1 if a configuration failed or
    produced inconsistent replicas."""
    from ..sim.costmodel import Profile
    from .report import text_summary, write_report
    from .runner import run_bench
    from .setup import local_setup, netem_setup

    if args.iters < 1 or args.warmup < 0 or args.head_to_head < 0:
        raise ValueError(f"--iters must be >= 1, --warmup and --head-to-head >= 0, got {args.iters}, "
                         f"{args.warmup} and {args.head_to_head}")
    grid = grid_from_args(args)
    if not grid.cells() and not (grid.models and grid.workers and (grid.baselines or grid.hook_variants())) and (
            args.no_sim or not grid.sim_cells()):
        raise ValueError("nothing to run: the --models/--workers/--strategies/--codecs/--baselines/--hooks and "
                         "--sim-* lists given leave no configuration (an empty list?)")
    profile = Profile.load(args.profile) if args.profile else None
    if args.out:  # an unusable --out fails now, not after the whole grid has run (hours for the full one)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        if not os.access(out, os.W_OK | os.X_OK):
            raise PermissionError(f"--out {args.out}: directory is not writable")
    setup = netem_setup(args.netem) if args.netem else local_setup(args.address)
    if setup.kind == "local" and setup.ray_address is not None and (grid.baselines or grid.hook_variants()):
        raise SystemExit(f"{prog}: the gloo/DDP baselines start their ranks on this machine, so against a Ray cluster "
                         "(--address) they would not share its links; add --baselines none --hooks none, or use the "
                         "emulated cluster of benchmarks/netem (--netem)")
    argv = getattr(args, "argv", None)
    if argv is None:  # `casync bench ...`: what follows the subcommand
        argv = sys.argv[sys.argv.index("bench") + 1:] if "bench" in sys.argv else sys.argv[1:]
    command = " ".join([prog] + [shlex.quote(a) for a in argv])
    if os.environ.get("CASYNC_BENCH_LAUNCH"):  # started by a wrapper (benchmarks/netem/netem.sh run): say how
        command = f"{os.environ['CASYNC_BENCH_LAUNCH']}\n# which ran, inside the emulated cluster:\n{command}"
    calibration = None
    if profile is None and not args.no_calibrate and (grid.cells() or grid.hook_variants()):
        calibration = calibrate_for(setup, refresh=args.recalibrate, progress=not args.no_progress,
                                    log=lambda msg: print(f"{prog}: {msg}", file=sys.stderr, flush=True))
        profile = calibration.profile
    print(f"{prog}: {len(grid.cells())} casync configurations + baselines {', '.join(grid.baselines) or 'none'} "
          f"+ {len(grid.hook_variants())} through the DDP hook "
          f"({setup.describe()}); {0 if args.no_sim else len(grid.sim_cells())} simulated", file=sys.stderr)
    result = run_bench(grid, setup, iters=args.iters, warmup=args.warmup, seed=args.seed, simulate=not args.no_sim,
                       progress=not args.no_progress, command=command, head_to_head=args.head_to_head,
                       profile=profile, profile_source=args.profile, calibration=calibration)
    print(text_summary(result))
    if args.out:
        written = write_report(result, args.out)
        print(f"table: {written['markdown']}\nraw JSON: {written['json']}\nplots ({len(written['plots'])}): "
              f"{Path(args.out) / 'bench_*.png'}, {Path(args.out) / 'gantt_*.png'}")
    bad = [r for r in result.rows if r.error or not r.consistent]
    for r in bad:
        print(f"{prog}: {r.model} N={r.workers} {r.label}: {r.error or 'workers ended with different results'}",
              file=sys.stderr)
    print(f"{prog}: done in {result.seconds:.0f} s", file=sys.stderr)
    return 1 if bad else 0


def calibrate_for(setup: Any, refresh: bool = False, progress: bool = False,
                  log: Callable[[str], None] | None = None) -> Any:
    """This setup's calibrated profile (``casync.runtime.machine_profile``): on this machine's embedded Ray, or on
    the cluster the setup joins; on the emulated cluster with one worker per node, so hops between nodes are fitted."""
    from ..runtime.machine_profile import QUICK_RECIPE, machine_calibration

    cluster = setup.cluster_model(QUICK_RECIPE["workers"]) if setup.kind == "netem" else None
    return machine_calibration(setup.ray_address, cluster, refresh=refresh, progress=progress, log=log)


def main(argv: list[str] | None = None, prog: str = "compare_strategies.py") -> int:
    p = argparse.ArgumentParser(prog=prog, description="Compare casync strategies x codecs against gloo/DDP "
                                                       "baselines, measured on RayEngine and simulated.")
    add_arguments(p)
    args = p.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    try:
        return run(args, prog)
    except (ValueError, TypeError, OSError) as exc:  # bad input, an unusable --out: one line, as `casync bench`
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
