"""benchmarks/netem: the emulated network comes up shaped and connected, goes away completely, and the scripts
skip cleanly where they cannot run.  No timing: the link rate is checked as configured, not measured."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]
LINKS = REPO / "benchmarks" / "netem" / "links.sh"
NETEM = REPO / "benchmarks" / "netem" / "netem.sh"


def _run(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


def _ours_exist() -> bool:
    names = _run(["ip", "netns", "list"]).stdout.split()
    return any(n.startswith(("csn", "cshost")) for n in names) or _run(["ip", "link", "show", "csbr0"]).returncode == 0


def test_scripts_skip_without_root():
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if not setpriv:
            pytest.skip("running as root without setpriv to drop privileges")
        prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    else:
        prefix = []
    for script in (LINKS, NETEM):
        proc = _run(prefix + ["bash", str(script), "up"])
        assert proc.returncode == 77, proc.stderr
        assert "SKIP: needs root" in proc.stderr


def test_bad_usage_is_refused():
    proc = _run(["bash", str(LINKS), "sideways"])
    assert proc.returncode == 2 and "usage" in proc.stderr


@pytest.fixture
def network():
    if os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("tc")):
        pytest.skip("needs root and iproute2")
    if _ours_exist():
        pytest.skip("a casync emulated network is up (a benchmark is running)")
    up = _run(["bash", str(LINKS), "up", "--nodes", "2", "--rate", "100mbit"])
    if up.returncode != 0:
        _run(["bash", str(LINKS), "down"])
        if "Operation not permitted" in up.stderr or "cannot create bridge" in up.stderr:
            pytest.skip(f"no permission to create network devices here: {up.stderr.strip()[-200:]}")
        pytest.fail(up.stderr)
    try:
        yield
    finally:
        _run(["bash", str(LINKS), "down"])


def test_links_are_shaped_connected_and_removed(network):
    names = _run(["ip", "netns", "list"]).stdout.split()
    assert {"csnh", "csn1", "csn2"} <= set(names)
    for ns, dev in (("csn1", "csv1"), ("csn2", "csv2")):
        inside = _run(["tc", "-n", ns, "qdisc", "show", "dev", dev]).stdout
        bridge_side = _run(["tc", "qdisc", "show", "dev", dev + "b"]).stdout
        assert "tbf" in inside and "rate 100Mbit" in inside, inside
        assert "tbf" in bridge_side and "rate 100Mbit" in bridge_side, bridge_side
    # the driver's link: 100 Mbit, except Ray's object-manager port (its result fetches) at 10x
    for args in (["tc", "-n", "csnh", "class", "show", "dev", "csvh"], ["tc", "class", "show", "dev", "csvhb"]):
        classes = _run(args).stdout
        assert "class htb 1:10" in classes and "rate 100Mbit" in classes, classes
        assert "class htb 1:20" in classes and "rate 1Gbit" in classes, classes
    # node 1 reaches node 2 across the bridge
    server = subprocess.Popen(["ip", "netns", "exec", "csn2", sys.executable, "-c",
                               "import socket; s = socket.socket(); s.bind(('10.77.0.12', 5999)); s.listen(1); "
                               "c, _ = s.accept(); c.sendall(c.recv(16))"], stdout=subprocess.PIPE)
    try:
        client = _run(["ip", "netns", "exec", "csn1", sys.executable, "-c",
                       "import socket, time\nfor _ in range(50):\n    try:\n"
                       "        c = socket.create_connection(('10.77.0.12', 5999), timeout=5); break\n"
                       "    except OSError: time.sleep(0.1)\nc.sendall(b'ping'); print(c.recv(16).decode())"], timeout=30)
        assert client.stdout.strip() == "ping", client.stderr
    finally:
        server.kill()
        server.wait()
    assert _run(["bash", str(LINKS), "down"]).returncode == 0
    assert not _ours_exist()
    assert _run(["bash", str(LINKS), "down"]).returncode == 0  # idempotent
