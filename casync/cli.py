"""The ``casync`` command line: ``plan`` (build, print, draw), ``bench`` (compare strategies), listings."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ._table import format_table, markdown_table


def _codec_arg(text: str) -> str | None:
    return None if text.lower() == "none" else text


def _add_plan_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="resnet50", help="built-in model name (see `casync models`)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--strategy", default="ring", help="ps | ring | allgather")
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
                      error_feedback=not args.no_error_feedback, op=args.op, bucket_bytes=args.bucket_bytes,
                      seed=args.seed)


def cmd_plan(args: argparse.Namespace) -> int:
    plan = _plan_from_args(args)
    print(plan.summary())
    if args.table:
        print(plan.table(args.tensor))
    if args.dot:
        Path(args.dot).write_text(plan.to_dot(args.tensor))
        print(f"wrote {args.dot}")
    if args.png:
        plan.draw(args.png, tensor=args.tensor)
        print(f"wrote {args.png}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .compare import compare, rows_json, rows_table

    strategies = args.strategies.split(",")
    codecs = args.codecs.split(",")
    rows = compare(args.model, workers=args.workers, strategies=strategies, codecs=codecs, steps=args.steps,
                   engine=args.engine, address=args.address, progress=not args.no_progress)
    headers, body = rows_table(rows)
    print(format_table(headers, body))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.md").write_text(markdown_table(headers, body) + "\n")
        (out / "compare.json").write_text(json.dumps(rows_json(rows), indent=2) + "\n")
        print(f"wrote {out / 'compare.md'} and {out / 'compare.json'}")
    return 0 if all(r.consistent for r in rows) else 1


def cmd_models(args: argparse.Namespace) -> int:
    from .models import model_names, model_num_params, model_shapes

    rows = [[n, len(model_shapes(n)), model_num_params(n)] for n in model_names()]
    print(format_table(["model", "tensors", "parameters"], rows))
    return 0


def cmd_codecs(args: argparse.Namespace) -> int:
    from primitives.codecs import available_codecs, get_codec

    rows = []
    for name in available_codecs():
        c = get_codec(name)
        rows.append([name, "yes" if c.lossless else "no", "yes" if c.sparse else "no",
                     round(c.compression_ratio(1 << 20), 1), ", ".join(f"{k}={v}" for k, v in c.params().items())])
    print(format_table(["codec", "lossless", "sparse", "ratio@1M", "default params"], rows))
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

    b = sub.add_parser("bench", help="compare strategies x codecs on a model's gradient shapes")
    b.add_argument("--model", default="resnet50")
    b.add_argument("--workers", type=int, default=4)
    b.add_argument("--strategies", default="ps,ring,allgather")
    b.add_argument("--codecs", default="none,fp16,onebit,topk:ratio=0.01")
    b.add_argument("--steps", type=int, default=2)
    b.add_argument("--engine", default="local", choices=["local", "ray"])
    b.add_argument("--address", default=None, help="Ray cluster address (ray engine); default: embedded Ray")
    b.add_argument("--out", default=None, help="directory for compare.md and compare.json")
    b.add_argument("--no-progress", action="store_true")
    b.set_defaults(func=cmd_bench)

    sub.add_parser("models", help="list built-in models").set_defaults(func=cmd_models)
    sub.add_parser("codecs", help="list registered codecs").set_defaults(func=cmd_codecs)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError) as exc:
        print(f"casync: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
