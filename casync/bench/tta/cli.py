"""Command line of the time-to-accuracy mode (``casync tta``)."""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from ...tasks.schedules import SCHEDULES

DEFAULT_STEPS = 300


def _names(values: list[str] | None) -> list[str] | None:
    """``--configs a,b c`` -> ``[a, b, c]``."""
    if values is None:
        return None
    return [n.strip() for v in values for n in v.split(",") if n.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", default=None, help="lm | image (casync.tasks)")
    p.add_argument("--data", default=None, metavar="PATH",
                   help="the task's data elsewhere: a folder of .py files (lm), of IDX files (image); default: the "
                        "task's own (the standard library; Fashion-MNIST from Debian's package)")
    p.add_argument("--configs", nargs="+", default=None, metavar="NAME",
                   help="configurations, space- or comma-separated (default: every one this casync can run for the "
                        "task; --list-configs names them)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=None, help=f"training steps of every run (default {DEFAULT_STEPS})")
    p.add_argument("--ranks", type=int, default=4, help="gloo ranks (default 4; one per node on the emulated cluster)")
    p.add_argument("--eval-every", type=int, default=None, metavar="E",
                   help="evaluate on rank 0 every E steps (default: a tenth of the steps), at 80 %% and at the end")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: the task's, tuned on allreduce)")
    p.add_argument("--batch-size", type=int, default=None, help="per rank (default: the task's)")
    p.add_argument("--schedule", choices=SCHEDULES, default=None,
                   help="learning-rate schedule over the steps (default: the task's, tuned with its rate)")
    p.add_argument("--target", type=float, default=None,
                   help="the metric to reach (default: what allreduce reaches at 80 %% of its steps, mean over seeds)")
    p.add_argument("--netem", default=None, metavar="LINKS_ENV",
                   help="run the ranks on the emulated cluster of benchmarks/netem (its links.env), one per node")
    p.add_argument("--compute-threads", type=int, default=1, metavar="N", help="ops a casync hook's rank runs at once")
    p.add_argument("--stall-timeout", type=float, default=900.0, metavar="S",
                   help="a run that makes no progress for S seconds fails (default 900)")
    p.add_argument("--out", default=None, help="directory for tta.md, tta.json and the plots")
    p.add_argument("--list-configs", action="store_true", help="list the configurations and whether each can run")
    p.add_argument("--no-progress", action="store_true")


def command_line(args: argparse.Namespace, prog: str, task: str, configs: list[str], steps: int, every: int) -> str:
    """The command that repeats this comparison, defaults spelt out (the configurations, steps, evaluations)."""
    parts = [prog, "--task", task] + (["--data", args.data] if args.data else []) + ["--configs", *configs]
    parts += ["--seeds", *map(str, args.seeds), "--steps", str(steps), "--ranks", str(args.ranks),
              "--eval-every", str(every)]
    for flag, value in (("--lr", args.lr), ("--batch-size", args.batch_size), ("--schedule", args.schedule),
                        ("--target", args.target),
                        ("--netem", args.netem), ("--out", args.out)):
        if value is not None:
            parts += [flag, str(value)]
    if args.compute_threads != 1:
        parts += ["--compute-threads", str(args.compute_threads)]
    return " ".join([prog] + [shlex.quote(p) for p in parts[1:]])


def run(args: argparse.Namespace, prog: str = "casync tta") -> int:
    """Run the comparison the arguments describe; print the table; 1 if a run failed, 0 otherwise."""
    from ...table import format_table
    from ...tasks import available_tasks, get_task
    from .configs import listing, resolve

    if args.list_configs:
        print(format_table(["configuration", "system", "tasks", "can run", "what"], listing(args.task)))
        return 0
    if args.task is None:
        raise ValueError(f"--task is required: one of {', '.join(available_tasks())}")
    task = get_task(args.task)
    if args.data is not None and not Path(args.data).exists():
        raise FileNotFoundError(f"--data {args.data!r}: no such file or folder")
    steps = DEFAULT_STEPS if args.steps is None else args.steps
    every = max(1, steps // 10) if args.eval_every is None else args.eval_every
    configs = resolve(_names(args.configs), task.name)
    if args.out:  # an unusable --out fails now, not after the runs
        Path(args.out).mkdir(parents=True, exist_ok=True)
        if not os.access(args.out, os.W_OK | os.X_OK):
            raise PermissionError(f"--out {args.out}: directory is not writable")
    from ..setup import local_setup, netem_setup
    from .report import text_summary, write_report
    from .runner import TTAError, describe, run_tta

    setup = netem_setup(args.netem) if args.netem else local_setup()
    command = command_line(args, prog, task.name, [c.name for c in configs], steps, every)
    if os.environ.get("CASYNC_BENCH_LAUNCH"):  # started by benchmarks/netem/netem.sh run: say how
        command = f"{os.environ['CASYNC_BENCH_LAUNCH']}\n# which ran, inside the emulated cluster:\n{command}"
    print(f"{prog}: {task.name}, {len(configs)} configurations x {len(args.seeds)} seeds, {steps} steps on "
          f"{args.ranks} ranks ({describe(setup)})", file=sys.stderr)
    try:
        result = run_tta(task, configs, seeds=args.seeds, steps=steps, ranks=args.ranks, eval_every=every,
                         setup=setup, data=args.data, lr=args.lr, batch_size=args.batch_size, schedule=args.schedule,
                         target=args.target, progress=not args.no_progress, stall_s=args.stall_timeout,
                         compute_threads=args.compute_threads, command=command)
    except TTAError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    print(text_summary(result))
    if args.out:
        written = write_report(result, args.out)
        print(f"table: {written['markdown']}\nJSON: {written['json']}\nplots: {', '.join(written['plots'])}")
    failed = [r for r in result["runs"] if r.get("error")]
    print(f"{prog}: done in {result['seconds']:.0f} s" + (f"; {len(failed)} run(s) failed" if failed else ""),
          file=sys.stderr)
    return 1 if failed else 0
