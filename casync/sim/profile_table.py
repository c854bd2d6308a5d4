"""A measured profile beside the packaged one, as ``casync profile`` prints it: how far this machine is from the
machine the packaged prices (and so the packaged predictions) come from."""
from __future__ import annotations

import math
from typing import Any

from .costmodel import COPY_KINDS, LinearCost, Profile, RuntimeCosts


def _gbps(cost: LinearCost | None) -> float | None:
    """float32 elements at ``b`` seconds each, as GB/s of input."""
    return None if cost is None else (4e-9 / cost.b if cost.b else math.inf)


def _cell(x: float | None, digits: int = 2) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def _ratio(measured: float | None, packaged: float | None) -> str:
    if measured is None or packaged is None or not packaged or not math.isfinite(measured * packaged):
        return ""
    return f"{measured / packaged:.2f}"


def codec_rows(measured: Profile, packaged: Profile) -> tuple[list[str], list[list[Any]]]:
    """Per codec measured: encode's constant and both throughputs, each beside the packaged value."""
    headers = ["codec", "encode a (us)", "packaged", "encode GB/s", "packaged", "decode GB/s", "packaged",
               "decode ÷ packaged"]
    body = []
    for key, ops in measured.codecs.items():
        pack = packaged.codecs.get(key, {})
        enc_a = ops["encode"].a * 1e6
        pack_a = pack["encode"].a * 1e6 if "encode" in pack else None
        dec, pack_dec = _gbps(ops["decode"]), _gbps(pack.get("decode"))
        body.append([key, _cell(enc_a, 1), _cell(pack_a, 1), _cell(_gbps(ops["encode"])),
                     _cell(_gbps(pack.get("encode"))), _cell(dec), _cell(pack_dec), _ratio(dec, pack_dec)])
    return headers, body


def _runtime_terms(rt: RuntimeCosts | None) -> list[tuple[str, float | None]]:
    """The runtime's terms in display units; the packaged profile has none (the ideal runtime: scale 1, no costs)."""
    rt = rt or RuntimeCosts(compute_scale=1.0, task_gap_s=0.0, hop=LinearCost(0.0, 0.0))
    return [("ops' time in loaded actors (×)", rt.compute_scale), ("executor per op (us)", rt.op_gap_s * 1e6),
            ("hop a (ms)", rt.hop.a * 1e3), ("hop b (ns/byte)", rt.hop.b * 1e9),
            ("executor per message (ms)", rt.message_cpu_s * 1e3),
            *((f"copy CPU, {kind} (ns/byte)", rt.copy_cpu[kind] * 1e9 if kind in rt.copy_cpu else None)
              for kind in COPY_KINDS),
            ("other CPU per sync (ms)", rt.sync_cpu_s * 1e3), ("backward's cores", rt.backward_cores)]


def machine_rows(measured: Profile, packaged: Profile) -> tuple[list[str], list[list[Any]]]:
    """Merge, transfer and task overhead, and (where ``measured`` is calibrated) the Ray runtime's terms, beside
    the packaged profile's (whose runtime is the ideal one)."""
    headers = ["term", "measured", "packaged", "measured ÷ packaged"]
    terms = [("merge (ns/element)", measured.merge.b * 1e9, packaged.merge.b * 1e9),
             ("transfer alpha (ms)", measured.transfer_alpha_s * 1e3, packaged.transfer_alpha_s * 1e3),
             ("transfer beta (GB/s)", measured.transfer_beta_bps / 1e9, packaged.transfer_beta_bps / 1e9),
             ("task overhead (ms)", measured.task_overhead_s * 1e3, packaged.task_overhead_s * 1e3)]
    if measured.runtime is not None:
        terms += [(name, m, p) for (name, m), (_, p) in zip(_runtime_terms(measured.runtime),
                                                             _runtime_terms(packaged.runtime))]
    return headers, [[name, _cell(m, 3), _cell(p, 3), _ratio(m, p)] for name, m, p in terms]


__all__ = ["codec_rows", "machine_rows"]
