"""How the benchmark scripts write their results: ``<stem>.md`` (the report) and ``<stem>.json`` (every number)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_results(out: str | Path, stem: str, text: str, raw: Any) -> Path:
    """Write ``text`` to ``<out>/<stem>.md`` and ``raw`` as JSON to ``<out>/<stem>.json``; returns the .md path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(raw, indent=1, default=str) + "\n")
    md = out / f"{stem}.md"
    md.write_text(text)
    return md
