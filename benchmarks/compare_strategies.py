#!/usr/bin/env python
"""Compare casync strategies x codecs against torch gloo/DDP baselines: measured on RayEngine, simulated at
larger scale; writes a Markdown table, raw JSON and PNG plots.  The same tool as ``casync bench``.

    python benchmarks/compare_strategies.py --quick --out out/            # ~3 minutes on 2 cores, embedded Ray
    python benchmarks/compare_strategies.py --out out/                    # the full grid (hours on 2 cores)
    sudo benchmarks/netem/netem.sh run -- --models resnet50 --workers 4   # over emulated 1 Gbit links

Every option: ``--help``; what each number means: the header of the Markdown it writes.
"""
from __future__ import annotations

import sys
from pathlib import Path

try:  # an installed casync or one on PYTHONPATH wins
    import casync  # noqa: F401
except ImportError:  # a checkout without `pip install -e .` (Ray hands this sys.path to its workers)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from casync.bench.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(prog="benchmarks/compare_strategies.py"))
