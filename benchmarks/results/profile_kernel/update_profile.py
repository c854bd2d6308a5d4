"""Put measure.py's results into a profile, in that profile's units (how the packaged profile got them).

    python benchmarks/results/profile_kernel/update_profile.py BASE.json measured.json OUT.json

* ``deferred`` of each block-decoding codec (onebit, fp16, terngrad, tbq): as measured, times the ratio of the
  codec's decode in BASE to its decode in the same measurement (onebit: the kernel's runs, averaged);
* onebit's ``encode`` and ``encode_ef``: BASE's, times the kernel's time over NumPy's in the alternating runs.

Ratios are taken at 2^22 elements and applied to both coefficients of a cost.
"""
import json
import sys

N = 2 ** 22


def at(cost, n=N):
    return cost[0] + cost[1] * n


def mean(entries, op):
    return [sum(e[op][0] for e in entries) / len(entries), sum(e[op][1] for e in entries) / len(entries)]


def scaled(cost, r):
    return [cost[0] * r, cost[1] * r]


def main(base_path: str, measured_path: str, out_path: str) -> None:
    profile, measured = json.load(open(base_path)), json.load(open(measured_path))
    kernel, numpy = measured["onebit"]["1"], measured["onebit"]["0"]
    onebit = profile["codecs"]["onebit"]
    for op in ("encode", "encode_ef"):
        r = at(mean(kernel, op)) / at(mean(numpy, op))
        onebit[op] = scaled(onebit[op], r)
        print(f"onebit {op}: x{r:.3f}")
    sources = {"onebit": {"deferred": mean(kernel, "deferred"), "decode": mean(kernel, "decode")},
               **measured["blocks"]}
    for name, costs in sources.items():
        entry = profile["codecs"][name]
        r = at(entry["decode"]) / at(costs["decode"])
        entry["deferred"] = scaled(costs["deferred"], r)
        print(f"{name} deferred: {at(costs['deferred']) * 1e3:.3f} ms at 2^22 measured, x{r:.2f} -> "
              f"{at(entry['deferred']) * 1e3:.3f} ms (its decode {at(entry['decode']) * 1e3:.3f} ms)")
    json.dump(profile, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:4])
