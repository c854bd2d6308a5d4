"""The ``casync`` command line: ``plan`` (build, print, draw), ``bench`` (compare strategies), ``tta`` (time to
accuracy on a real task), ``train`` (data-parallel training on digits), listings."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Callable

from casync.strategies import available_strategies

from .table import format_table


def _codec_arg(text: str) -> str | None:
    return None if text.lower() == "none" else text


def _add_plan_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="resnet50", help="built-in model name (see `casync models`)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--strategy", default="ring", help=" | ".join(available_strategies()))
    p.add_argument("--codec", default="onebit", help="codec name, optionally with params: topk:ratio=0.01")
    p.add_argument("--servers", type=int, default=None, help="PS only: dedicated server actors")
    p.add_argument("--partitions", type=int, default=None)
    p.add_argument("--one-way", action="store_true", help="PS: send the aggregate back uncompressed")
    p.add_argument("--no-error-feedback", action="store_true")
    p.add_argument("--op", default="mean", choices=["mean", "sum"])
    p.add_argument("--bucket-bytes", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)


def _plan_from_args(args: argparse.Namespace):
    from .build import build_plan

    return build_plan(args.model, workers=args.workers, strategy=args.strategy, codec=_codec_arg(args.codec),
                      servers=args.servers, partitions=args.partitions, two_way=not args.one_way,
                      error_feedback=False if args.no_error_feedback else "auto", op=args.op, bucket_bytes=args.bucket_bytes,
                      seed=args.seed)


def cmd_plan(args: argparse.Namespace) -> int:
    plan = _plan_from_args(args)
    if args.tensor is not None and args.tensor not in {b.name for b in plan.buckets}:
        args.tensor = plan.bucket_of(args.tensor).name  # a tensor fused into a bucket: show that bucket
    print(plan.summary())
    if args.table:
        print(plan.table(args.tensor))
    if args.dot:
        Path(args.dot).write_text(plan.to_dot(args.tensor))
        print(f"wrote {args.dot}")
    if args.png:
        plan.draw(args.png, bucket=args.tensor)
        print(f"wrote {args.png}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench.cli import run

    return run(args, prog="casync bench")


def cmd_tta(args: argparse.Namespace) -> int:
    from .bench.tta.cli import run

    return run(args, prog="casync tta")


def cmd_profile(args: argparse.Namespace) -> int:
    from .sim.costmodel import Profile
    from .sim.profile_table import codec_rows, machine_rows
    from .sim.profiler import DEFAULT_SIZES, QUICK_SIZES, profile

    if (args.netem or args.calibration_workers is not None) and not args.calibrate_ray:
        raise ValueError("--netem and --calibration-workers only say how --calibrate-ray runs; add --calibrate-ray")
    if args.calibration_workers is not None and args.calibration_workers < 2:
        raise ValueError(f"--calibration-workers must be at least 2 (the plans must send), got {args.calibration_workers}")
    out = Path(args.out)  # an unusable --out fails now, not after minutes of measuring
    if out.is_dir():
        raise ValueError(f"--out {args.out} is a directory; give the file to write (e.g. {out / 'profile.json'})")
    out.parent.mkdir(parents=True, exist_ok=True)
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise PermissionError(f"--out {args.out}: cannot write into {out.parent}")
    sizes = QUICK_SIZES if args.quick else DEFAULT_SIZES
    packaged = Profile.default()
    transfer = None
    # the transfer micro-benchmark is between two actors of one node: not what an emulated cluster would give
    if not (args.no_transfer or args.netem):
        from .runtime.transfer import profile_transfer

        transfer = profile_transfer(repeat=1 if args.quick else 3, transport=args.transport)
    result = profile(sizes=sizes, repeat=1 if args.quick else 3, transfer=transfer, progress=not args.no_progress)
    print(format_table(*codec_rows(result, packaged)))
    if args.calibrate_ray:
        from .runtime.calibrate import calibrate_ray, calibration_plans

        workers = 2 if args.calibration_workers is None else args.calibration_workers
        address = cluster = None
        if args.netem:
            from .bench.setup import netem_setup

            setup = netem_setup(args.netem)
            address, cluster = setup.ray_address, setup.cluster_model(workers)
        plans = None if args.calibration_workers is None else calibration_plans(workers=workers)
        result = calibrate_ray(plans=plans, profile=result, progress=not args.no_progress, address=address,
                               cluster=cluster, transport=args.transport)
        rt = result.runtime
        remote = (f"; between nodes, beyond the link: {rt.remote_hop.a * 1e3:.2f} ms + {rt.remote_hop.b * 1e9:.3f} ns/byte"
                  if rt.remote_hop is not None else "")
        copies = ", ".join(f"{kind} {b * 1e9:.3f} ns/byte" for kind, b in rt.copy_cpu.items())
        threads = (f"; other threads' CPU {rt.sync_cpu_s * 1e3:.2f} ms per sync + {rt.message_cpu_s * 1e3:.3f} ms "
                   f"per message + copies {copies or 'not fitted'}" if rt.plane == "direct" else "")
        print(f"Ray runtime: ops x{rt.compute_scale:.2f} in loaded actors, {rt.task_gap_s * 1e3:.2f} ms per fused task, "
              f"hop {rt.hop.a * 1e3:.2f} ms + {rt.hop.b * 1e9:.3f} ns/byte{remote}{threads}")
    print(format_table(*machine_rows(result, packaged)))
    print(f"packaged: casync/data/default_profile.json, {packaged.machine.get('cpu', '?')}, measured "
          f"{packaged.machine.get('measured', '?')}; its runtime is the ideal one (none calibrated)"
          + ("" if transfer is not None else "; transfer and task overhead not measured here (--no-transfer, "
                                              "--netem): the packaged values"))
    result.save(args.out)
    print(f"wrote {args.out}")
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from .build import build_plan
    from .planner import backward_ready_times
    from .sim.costmodel import ClusterModel, Profile
    from .sim.simulator import simulate

    cluster = ClusterModel.for_workers(args.workers, workers_per_node=args.workers_per_node,
                                       bandwidth_gbps=args.bandwidth, latency_us=args.latency_us)
    profile = Profile.load(args.profile) if args.profile else Profile.default()
    codec = args.codec
    if codec != "auto":
        codec = [_codec_arg(c.strip()) for c in codec.split(",")] if "," in codec else _codec_arg(codec)
    strategy = args.strategy if "," not in args.strategy else [s.strip() for s in args.strategy.split(",")]
    partitions = args.partitions
    if partitions not in (None, "auto"):
        if not partitions.isdigit():
            raise ValueError(f"--partitions must be 'auto' or an int, got {partitions!r}")
        partitions = int(partitions)
    ready = backward_ready_times(args.model, args.backward_ms / 1e3) if args.backward_ms else None
    plan = build_plan(args.model, workers=args.workers, strategy=strategy, codec=codec, partitions=partitions,
                      bucket_bytes=args.bucket_bytes, cluster=cluster, profile=profile, ready_times=ready)
    timeline = simulate(plan, cluster, profile, ready)
    print(plan.summary())
    info = plan.options.get("planner")
    if info:
        print(f"planner: {info['chosen']}; its bucket-by-bucket estimate {info['estimated_s'] * 1e3:.1f} ms, "
              f"simulated {info['simulated_s'] * 1e3:.1f} ms; {info['simulations']} simulations, {info['seconds']:.2f} s")
    path_s = timeline.critical_path_seconds()
    compute_s, transfer_s = path_s["compute"], path_s["transfer"]
    shape = (f"{cluster.nodes} nodes x {cluster.workers_per_node} workers" if cluster.nodes * cluster.workers_per_node
             == args.workers else f"{args.workers} workers on {cluster.nodes} nodes, up to {cluster.workers_per_node} a node")
    print(f"cluster: {shape}, {args.bandwidth:g} Gbps, "
          f"{args.latency_us:g} us" + (f"; backward pass {args.backward_ms:g} ms" if ready else ""))
    print(f"simulated iteration time: {timeline.iteration_time * 1e3:.1f} ms")
    print(f"critical path: {len(timeline.critical_path)} ops ({compute_s * 1e3:.1f} ms compute, "
          f"{transfer_s * 1e3:.1f} ms transfers)")
    print(f"bytes on the wire: {plan.wire_bytes():,} ({sum(timeline.bytes_per_link.values()):,} between nodes)")
    if args.png:
        timeline.draw(args.png, title=f"{args.model}, {args.workers} workers, {args.bandwidth:g} Gbps: "
                                      f"{timeline.iteration_time * 1e3:.1f} ms")
        print(f"wrote {args.png}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from .datasets.digits import SGD, DigitsData, DigitsMLP, accuracy, cross_entropy
    from .engines.memory import WARMUP_SYNCS
    from .training import Trainer

    for flag, value in (("--steps", args.steps), ("--epochs", args.epochs)):
        if value is not None and value < 0:  # refused before Ray starts (Trainer.fit would, once it has)
            raise ValueError(f"{flag} must be >= 0, got {value}")
    settings = _train_settings(args)
    fns = (DigitsMLP.named(settings["model"]), SGD(lr=settings["lr"], momentum=settings["momentum"]), cross_entropy,
           DigitsData(batch_size=settings["batch_size"], seed=settings["seed"]))
    progress = not args.no_progress
    if args.resume:
        runtime = {} if args.compute_threads is None else {"compute_threads": args.compute_threads}  # not in results
        trainer = Trainer.load(args.resume, *fns, address=args.address, progress=progress, **runtime)
    else:
        extra = {} if args.bucket_bytes is None else {"bucket_bytes": args.bucket_bytes}
        trainer = Trainer(*fns, workers=args.workers, strategy=args.strategy, codec=_codec_arg(args.codec),
                          address=args.address, seed=settings["seed"], error_feedback=False if args.no_error_feedback else "auto",
                          momentum_correction=args.momentum_correction, delayed_update=args.delayed_update,
                          full_sync_every=args.full_sync_every, warmup_steps=args.warmup_steps, progress=progress,
                          compute_threads=1 if args.compute_threads is None else args.compute_threads, **extra)
    with trainer:
        steps = 100 if args.steps is None and args.epochs is None else args.steps
        history = trainer.fit(steps=steps, epochs=args.epochs)
        acc = accuracy(trainer.model())
        skip = min(WARMUP_SYNCS, max(len(history) - 1, 0))  # the first steps fault in buffers and warm Ray up
        print(trainer.plan.summary())
        print(f"trained {len(history)} steps (to step {trainer.step}) on {trainer.workers} workers: "
              f"held-out accuracy {acc:.4f}" + (f", final loss {history.mean('loss', max(0, len(history) - 10)):.4f}"
                                                if len(history) else ""))
        if len(history):  # no steps (--steps 0): no per-step means to print (they would all be nan)
            print(f"time per step {history.mean('step_s', skip) * 1e3:.1f} ms (compute {history.mean('compute_s', skip) * 1e3:.1f} ms, "
                  f"sync {history.mean('sync_s', skip) * 1e3:.1f} ms, {history.mean('hidden_fraction', skip):.0%} of it "
                  f"hidden behind backward); {history.mean('bytes_sent') / 2**20:.2f} MiB sent per step, "
                  f"compression {history.mean('compression_ratio'):.1f}x")
            print(f"the sync's ops took {history.mean('sync_cpu_s', skip) * 1e3:.1f} ms of CPU per worker and step")
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            history.to_csv(out / "history.csv")
            history.to_json(out / "history.json")
            trainer.draw_timeline(str(out / "timeline.png"), step=trainer.step - 1 if history else None)
            print(f"wrote {out / 'history.csv'}, {out / 'history.json'} and {out / 'timeline.png'}")
        if args.checkpoint:
            saved = trainer.save(args.checkpoint)
            (Path(saved) / TRAIN_SETTINGS_FILE).write_text(json.dumps(settings, indent=1))
            print(f"checkpoint: {saved}")
    return 0


#: what `casync train` builds its model, optimizer and data from, with their defaults; saved beside a checkpoint
TRAIN_SETTINGS = {"model": "mlp", "batch_size": 32, "lr": 0.2, "momentum": 0.0, "seed": 0}
TRAIN_SETTINGS_FILE = "casync_train.json"


def _train_settings(args: argparse.Namespace) -> dict:
    """The model, data and optimizer settings of this run: with ``--resume``, the checkpoint's (a flag that
    contradicts them is refused: the run would silently change its batches or be overridden by the optimizer's
    saved state); otherwise the flags, or their defaults."""
    saved: dict = {}
    if args.resume and (Path(args.resume) / TRAIN_SETTINGS_FILE).is_file():
        saved = json.loads((Path(args.resume) / TRAIN_SETTINGS_FILE).read_text())
    settings = {}
    for key, default in TRAIN_SETTINGS.items():
        given = getattr(args, key)
        if key in saved and given is not None and given != saved[key]:
            raise ValueError(f"--{key.replace('_', '-')} {given}: the checkpoint {args.resume} was trained with "
                             f"{saved[key]!r}, and a resumed run keeps its settings (leave the flag out)")
        settings[key] = saved.get(key, default if given is None else given)
    return settings


def cmd_models(args: argparse.Namespace) -> int:
    from .plan.models import model_names, model_num_params, model_shapes

    rows = [[n, len(model_shapes(n)), model_num_params(n)] for n in model_names()]
    print(format_table(["model", "tensors", "parameters"], rows))
    return 0


def cmd_codecs(args: argparse.Namespace) -> int:
    from casync.primitives import feedback
    from casync.primitives.codecs import ALIASES, available_codecs, get_codec
    from casync.sim.costmodel import Profile

    profile, n = Profile.default(), 1 << 20

    def gbs(seconds: float | None) -> float | str:  # GB/s of float32 input at 1M elements, by the packaged profile
        return "-" if seconds is None else round(4 * n / seconds / 1e9, 2)

    def priced(cost: Callable[..., float], key: str) -> float | None:
        try:
            return cost(key, n, runtime=False)
        except KeyError:  # the packaged profile does not price it
            return None

    aliases: dict[str, list[str]] = {}
    for alias, name in ALIASES.items():
        aliases.setdefault(name, []).append(alias)
    rows = []
    for name in available_codecs():
        c = get_codec(name)
        ef = feedback.kind(c, feedback.resolve(c, "auto"))
        key = str(c)
        rows.append([name, round(c.compression_ratio(n), 1), ef + (", votes" if c.votes else ""),
                     gbs(priced(profile.encode_s, key)), gbs(priced(profile.decode_s, key)),
                     ", ".join(f"{k}={v}" for k, v in c.params().items()), ", ".join(aliases.get(name, []))])
    print(format_table(["codec", "ratio@1M", "error feedback (auto)", "enc GB/s@1M", "dec GB/s@1M", "default params",
                        "aliases"], rows))
    return 0


def strategy_table(markdown: bool = False) -> str:
    """Every registered strategy with its ops per partition (K partitions, N workers): the README's table."""
    from casync.strategies import STRATEGIES

    from .table import markdown_table

    rows = []
    for name, s in STRATEGIES.items():
        c = s.costs
        rows.append([f"`{name}`" if markdown else name, c.get("encode", "?"), c.get("decode", "?"), c.get("merge", "?"),
                     c.get("send", "?"), "yes" if s.has_compact() else "no", s.summary])
    headers = ["strategy", "encode", "decode", "merge", "send (= recv)", "compact template", "what it does"]
    return markdown_table(headers, rows) if markdown else format_table(headers, rows)


def cmd_strategies(args: argparse.Namespace) -> int:
    print(strategy_table(markdown=args.markdown))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="casync", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="build a sync plan, print its summary, optionally draw it")
    _add_plan_options(p)
    p.add_argument("--dot", help="write Graphviz DOT to this file")
    p.add_argument("--png", help="write a PNG picture to this file")
    p.add_argument("--table", action="store_true", help="also print every op as a table")
    p.add_argument("--tensor", default=None, help="restrict --table/--dot/--png to one bucket")
    p.set_defaults(func=cmd_plan)

    b = sub.add_parser("bench", help="compare strategies x codecs against gloo/DDP baselines (tables, plots, JSON)")
    from .bench.cli import add_arguments as add_bench_arguments

    add_bench_arguments(b)
    b.set_defaults(func=cmd_bench)

    a = sub.add_parser("tta", help="time to accuracy: train a real task (lm | image) with casync's configurations and "
                                   "PyTorch's DDP hooks (table, plots, JSON)")
    from .bench.tta.cli import add_arguments as add_tta_arguments

    add_tta_arguments(a)
    a.set_defaults(func=cmd_tta)

    m = sub.add_parser("simulate", help="plan (auto by default) and simulate one iteration on a cluster model")
    m.add_argument("--model", default="resnet50", help="built-in model name (see `casync models`)")
    m.add_argument("--workers", type=int, default=8)
    m.add_argument("--bandwidth", type=float, default=25.0, help="NIC bandwidth in Gbps")
    m.add_argument("--latency-us", type=float, default=50.0, help="one-way link latency in microseconds")
    m.add_argument("--workers-per-node", type=int, default=1)
    m.add_argument("--strategy", default="auto", help=" | ".join(["auto", *available_strategies()]) + " | comma-list of candidates")
    m.add_argument("--codec", default="auto", help="auto | a codec name | comma-list of candidate codecs")
    m.add_argument("--partitions", default="auto", help="auto | an int (default: auto)")
    m.add_argument("--bucket-bytes", type=int, default=None)
    m.add_argument("--backward-ms", type=float, default=0.0,
                   help="overlap with a backward pass this long (gradients ready in proportion to size)")
    m.add_argument("--profile", default=None, help="profile JSON (default: the packaged one)")
    m.add_argument("--png", help="write the simulated timeline (Gantt chart) to this PNG")
    m.set_defaults(func=cmd_simulate)

    pr = sub.add_parser("profile", help="measure this machine's codec, merge and transfer costs (JSON)")
    pr.add_argument("--out", default="profile.json")
    pr.add_argument("--quick", action="store_true", help="fewer sizes and repeats (seconds, not minutes)")
    pr.add_argument("--no-transfer", action="store_true", help="skip the actor-to-actor transfer measurement")
    pr.add_argument("--transport", default="direct", choices=["direct", "objectstore"],
                    help="the data plane whose transfer cost is measured (default: direct)")
    pr.add_argument("--calibration-workers", type=int, default=None,
                    help="with --calibrate-ray: workers of the calibration plans (default 2; as many as a machine "
                         "will run, to price the ops as they run when actors share its cores and caches)")
    pr.add_argument("--calibrate-ray", action="store_true",
                    help="also run calibration plans on RayEngine and fit the runtime's costs (what simulate "
                         "needs to predict RayEngine on this machine)")
    pr.add_argument("--netem", default=None, metavar="LINKS_ENV",
                    help="with --calibrate-ray: calibrate on the emulated cluster of benchmarks/netem (one worker "
                         "per node, so the hops between nodes are fitted too); run it through `netem.sh exec`")
    pr.add_argument("--no-progress", action="store_true")
    pr.set_defaults(func=cmd_profile)

    t = sub.add_parser("train", help="data-parallel training of an MLP on scikit-learn's digits through casync")
    t.add_argument("--model", default=None, help="mlp (64-2048-2048-10, the default) | mlp-deep (64-1024x4-10)")
    t.add_argument("--workers", type=int, default=4)
    t.add_argument("--strategy", default="ring", help=" | ".join(available_strategies()))
    t.add_argument("--codec", default="onebit", help="codec name, optionally with params: topk:ratio=0.01")
    length = t.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, default=None, help="default: 100")
    length.add_argument("--epochs", type=int, default=None)
    t.add_argument("--batch-size", type=int, default=None, help="per worker (default 32)")
    t.add_argument("--lr", type=float, default=None, help="default 0.2")
    t.add_argument("--momentum", type=float, default=None, help="SGD momentum (in the optimizer; default 0)")
    t.add_argument("--momentum-correction", type=float, default=None,
                   help="DGC: per-worker momentum before compression, instead of --momentum")
    t.add_argument("--warmup-steps", type=int, default=0, help="DGC sparsity warm-up (sparse codecs)")
    t.add_argument("--delayed-update", action="store_true", help="apply step t's update while step t+1 computes")
    t.add_argument("--full-sync-every", type=int, default=None, help="an uncompressed sync every k steps")
    t.add_argument("--no-error-feedback", action="store_true")
    t.add_argument("--bucket-bytes", type=int, default=None)
    t.add_argument("--compute-threads", type=int, default=None,
                   help="sync ops each worker runs at once: more where every worker has cores of its own (default 1; "
                        "with --resume, the checkpoint's unless given)")
    t.add_argument("--seed", type=int, default=None, help="default 0")
    t.add_argument("--address", default=None, help="Ray cluster address; default: embedded local Ray")
    t.add_argument("--out", default=None, help="directory for history.csv/json and timeline.png")
    t.add_argument("--checkpoint", default=None, help="save a checkpoint directory here at the end")
    t.add_argument("--resume", default=None, help="continue from this checkpoint (its settings win; a model, "
                   "data or optimizer flag that contradicts them is refused)")
    t.add_argument("--no-progress", action="store_true")
    t.set_defaults(func=cmd_train)

    sub.add_parser("models", help="list built-in models").set_defaults(func=cmd_models)
    sub.add_parser("codecs", help="list registered codecs").set_defaults(func=cmd_codecs)
    s = sub.add_parser("strategies", help="list registered strategies and what each costs per partition")
    s.add_argument("--markdown", action="store_true", help="as the README's markdown table")
    s.set_defaults(func=cmd_strategies)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from .errors import SyncError

    try:
        return args.func(args)
    except BrokenPipeError:  # the reader went away (`casync plan --table | head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's exit flush would fail again
        return 141  # 128 + SIGPIPE
    except (ValueError, TypeError, KeyError, OSError) as exc:  # bad input, a missing file: one line, no traceback
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"casync: error: {message}", file=sys.stderr)
        return 2
    except SyncError as exc:  # the engine failed (a lost actor, a timeout): not the user's input
        print(f"casync: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
