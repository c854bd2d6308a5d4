"""How the packaged profile got onebit's C-kernel prices and every block-decoding codec's ``deferred`` cost.

    python benchmarks/profile_deferred.py measure MEASURED.json [--rounds 2] [--repeat 15]
    python benchmarks/profile_deferred.py update BASE.json MEASURED.json OUT.json

``measure`` profiles, on this machine, onebit's ops with the kernel on and off in alternating runs
(``CASYNC_SIGN_KERNEL=1/0``) and the ops of fp16, terngrad and tbq (their ``deferred``: what one more payload adds
to a merge that decodes it block by block), at the packaged profile's sizes, and writes the fitted costs.

``update`` puts them into a profile in that profile's units, not mixing days of a shared host:

* ``deferred`` of each block-decoding codec (onebit, fp16, terngrad, tbq): as measured, times the ratio of the
  codec's decode in BASE to its decode in the same measurement (onebit: the kernel's runs, averaged);
* onebit's ``encode`` and ``encode_ef``: BASE's, times the kernel's time over NumPy's in the alternating runs.

Ratios are taken at 2^22 elements and applied to both coefficients of a cost.  Run on the profile before the
change with ``benchmarks/results/profile/deferred/measured.json``, it gives the packaged
``casync/data/default_profile.json`` (its ``note`` aside).
"""
from __future__ import annotations

import argparse
import json
import os

N = 2 ** 22
BLOCK_CODECS = ("fp16", "terngrad", "tbq")


def at(cost: list[float], n: int = N) -> float:
    """Seconds of a fitted ``[a, b]`` cost at ``n`` elements."""
    return cost[0] + cost[1] * n


def mean(entries: list[dict], op: str) -> list[float]:
    """The mean ``[a, b]`` of ``op`` over several measured runs."""
    return [sum(e[op][0] for e in entries) / len(entries), sum(e[op][1] for e in entries) / len(entries)]


def scaled(cost: list[float], r: float) -> list[float]:
    return [cost[0] * r, cost[1] * r]


def measure(rounds: int = 2, repeat: int = 15, sizes=None) -> dict:
    """``{"onebit": {"1": [costs per run], "0": [...]}, "blocks": {codec: costs}}``, costs as ``{op: [a, b]}``."""
    from casync.sim.profiler import DEFAULT_SIZES, profile_codecs

    sizes = DEFAULT_SIZES if sizes is None else sizes
    saved = os.environ.get("CASYNC_SIGN_KERNEL")
    out: dict = {"onebit": {"1": [], "0": []}, "blocks": None}
    try:
        for _ in range(rounds):
            for kernel in ("1", "0"):
                os.environ["CASYNC_SIGN_KERNEL"] = kernel
                costs = profile_codecs(["onebit"], sizes, repeat)["onebit"]
                out["onebit"][kernel].append({op: [lc.a, lc.b] for op, lc in costs.items()})
        os.environ["CASYNC_SIGN_KERNEL"] = "1"
        costs = profile_codecs(BLOCK_CODECS, sizes, repeat)
        out["blocks"] = {k: {op: [lc.a, lc.b] for op, lc in v.items()} for k, v in costs.items()}
    finally:
        if saved is None:
            os.environ.pop("CASYNC_SIGN_KERNEL", None)
        else:
            os.environ["CASYNC_SIGN_KERNEL"] = saved
    return out


def update(profile: dict, measured: dict) -> list[str]:
    """Put ``measured`` (what :func:`measure` returns) into ``profile`` in place; returns what it did, a line each."""
    lines = []
    kernel, numpy = measured["onebit"]["1"], measured["onebit"]["0"]
    onebit = profile["codecs"]["onebit"]
    for op in ("encode", "encode_ef"):
        r = at(mean(kernel, op)) / at(mean(numpy, op))
        onebit[op] = scaled(onebit[op], r)
        lines.append(f"onebit {op}: x{r:.3f}")
    sources = {"onebit": {"deferred": mean(kernel, "deferred"), "decode": mean(kernel, "decode")},
               **measured["blocks"]}
    for name, costs in sources.items():
        entry = profile["codecs"][name]
        r = at(entry["decode"]) / at(costs["decode"])
        entry["deferred"] = scaled(costs["deferred"], r)
        lines.append(f"{name} deferred: {at(costs['deferred']) * 1e3:.3f} ms at 2^22 measured, x{r:.2f} -> "
                     f"{at(entry['deferred']) * 1e3:.3f} ms (its decode {at(entry['decode']) * 1e3:.3f} ms)")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="profile onebit (kernel on/off) and the block-decoding codecs")
    m.add_argument("out")
    m.add_argument("--rounds", type=int, default=2)
    m.add_argument("--repeat", type=int, default=15)
    u = sub.add_parser("update", help="put a measurement into a profile, in its units")
    u.add_argument("base")
    u.add_argument("measured")
    u.add_argument("out")
    args = parser.parse_args(argv)
    if args.command == "measure":
        measured = measure(args.rounds, args.repeat)
        with open(args.out, "w") as f:
            json.dump(measured, f, indent=1)
        for kernel, runs in measured["onebit"].items():
            for run in runs:
                print(f"onebit, kernel {kernel}:", {op: round(at(c) * 1e3, 3) for op, c in run.items()})
        for name, costs in measured["blocks"].items():
            print(name, {op: round(at(c) * 1e3, 3) for op, c in costs.items()})
    else:
        with open(args.base) as f:
            profile = json.load(f)
        with open(args.measured) as f:
            measured = json.load(f)
        print("\n".join(update(profile, measured)))
        with open(args.out, "w") as f:
            json.dump(profile, f, indent=1)


if __name__ == "__main__":
    main()
