"""Bytes the emulated links carried, read from the shaping qdiscs (``tc``; needs root)."""
from __future__ import annotations

import json
import re
import subprocess


def qdisc_sent_bytes(dev: str, netns: str | None = None) -> int | None:
    """Bytes the root qdisc of ``dev`` has sent (``tc -s -j qdisc show``; needs root), counted as the wire
    sees them (a segmentation-offloaded packet counts every segment's headers).  None where unreadable."""
    try:
        out = subprocess.run(["tc"] + (["-n", netns] if netns else []) + ["-s", "-j", "qdisc", "show", "dev", dev],
                             capture_output=True, text=True, check=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    roots = [q for q in json.loads(out or "[]") if q.get("root")]
    return int(roots[0]["bytes"]) if roots else None


def class_bytes(dev: str, classid: str) -> int:
    """Bytes an htb class of a device on the bridge has sent (``tc -s class show`` in the machine's own
    network namespace, named ``cshost`` by links.sh; this iproute2 prints no JSON for classes)."""
    out = subprocess.run(["tc", "-n", "cshost", "-s", "class", "show", "dev", dev], capture_output=True, text=True,
                         check=True, timeout=10).stdout
    match = re.search(rf"class htb {re.escape(classid)} .*?\n\s*Sent (\d+) bytes", out)
    if not match:
        raise RuntimeError(f"no htb class {classid} on {dev} (is the emulated network up?):\n{out}")
    return int(match.group(1))
