"""How the packaged profile got the costs of GRACE's codecs and dithering (issue #45), in its own units.

    python benchmarks/probes/profile_grace_codecs.py measure MEASURED.json [--repeat 5] [--only CODEC ...]
    python benchmarks/probes/profile_grace_codecs.py update BASE.json MEASURED.json OUT.json

``measure`` profiles (``casync.sim.profiler.profile_codecs``, the packaged profile's sizes) the new codecs and, in
the same run, three reference codecs whose ops are plain NumPy passes like theirs (fp16, tbq, qsgd), and writes the
fitted costs (signsgd's without an error-feedback encode: it has none).

``update`` puts the new codecs MEASURED has into a profile (replacing BASE's entries for them; every other entry
stays), each op's measured ``[a, b]`` times the median over the reference codecs of BASE's cost of that op over the
measured one (at 2^22 elements; the ops in ``OPS``): a shared 2-core host runs slower on a busy day, and the ratio
carries the new codecs over to the day BASE was measured on.  The answer: ``benchmarks/results/codecs/grace/README.md``.
"""
from __future__ import annotations

import argparse
import json
import statistics

N = 2 ** 22
REFERENCE = ("fp16", "tbq", "qsgd")
#: what update carries over; not ``deferred`` (a block decoder's decode handed to its merge), which measured 0 for
#: every codec on the loaded host: without it the simulator prices a whole decode and a dense merge input
OPS = ("encode", "encode_ef", "decode")
NEW = ("signsgd", "onebit2", "natural", "u8bit", "sketch", "dithering")


def at(cost: list[float], n: int = N) -> float:
    return cost[0] + cost[1] * n


def measure(out: str, repeat: int, only: list[str] | None = None) -> None:
    from casync.primitives.codecs.signs import SignSGDCodec
    from casync.sim.profiler import profile_codecs

    class Timed(SignSGDCodec):  # the profiler times an error-feedback encode too, which signsgd never runs
        ef_sound = True

    specs = [*REFERENCE, *(Timed() if name == "signsgd" else name for name in only or NEW)]
    costs = profile_codecs(specs, repeat=repeat, progress=True)
    costs.get("signsgd", {}).pop("encode_ef", None)
    json.dump({codec: {op: [c.a, c.b] for op, c in ops.items()} for codec, ops in costs.items()}, open(out, "w"),
              indent=1)


def update(base_path: str, measured_path: str, out: str) -> None:
    from casync.primitives.codecs import get_codec

    base, measured = json.load(open(base_path)), json.load(open(measured_path))
    refs = [str(get_codec(name)) for name in REFERENCE]
    ratio = {}
    for op in OPS:
        pairs = [at(base["codecs"][r][op]) / at(measured[r][op]) for r in refs if op in base["codecs"][r]]
        ratio[op] = statistics.median(pairs)
    print("BASE / measured, by op:", {op: round(r, 3) for op, r in ratio.items()})
    for name in NEW:
        key = str(get_codec(name))
        if key not in measured:  # not in this measurement: BASE's entry, if any, stays
            continue
        base["codecs"][key] = {op: [c[0] * ratio[op], c[1] * ratio[op]] for op, c in measured[key].items() if op in OPS}
    json.dump(base, open(out, "w"), indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("out")
    m.add_argument("--repeat", type=int, default=5)
    m.add_argument("--only", nargs="+", choices=NEW, default=None, help="measure these of the new codecs only")
    u = sub.add_parser("update")
    u.add_argument("base")
    u.add_argument("measured")
    u.add_argument("out")
    args = ap.parse_args()
    if args.cmd == "measure":
        measure(args.out, args.repeat, args.only)
    else:
        update(args.base, args.measured, args.out)


if __name__ == "__main__":
    main()
