"""The documented cluster path, for real: `ray start --head`, `ray start --address`, a driver, `ray job submit`.

A two-node Ray cluster is started on this machine with the Ray CLI, in subprocesses: a head (GCS, dashboard and
job server) and a second node that joins it, each with one CPU, a small object store, its own --temp-dir and
non-default ports.  examples/cluster_sync.py then runs against it twice -- as a plain driver and as a submitted
job -- and must place its two actors on two different nodes and match LocalEngine bit for bit (docs/cluster.md).

Isolation.  Where this process may create a network namespace (root with `unshare` and `ip`), the whole cluster,
its drivers and the job client run inside a private one whose only interface is loopback: every Ray port then
listens on 127.0.0.1 and nothing outside the namespace can reach it.  (Without that, Ray 2.60 on Linux does not let
`ray start` bind to loopback: it rewrites --node-ip-address / --address 127.0.0.1 to the machine's routable address
and the node's gRPC servers listen on all interfaces; the test then runs in the host namespace.)  Token
authentication is on in both cases, with a token made for this test (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN): the
default of ~/.ray/auth_token is not read or written.

Teardown never runs `ray stop` (it would kill every Ray on the machine, other test sessions included): it ends
exactly the processes of this cluster -- those whose command line names its temp dir or GCS address, and their
descendants -- by pid.
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "examples/cluster_sync.py"
RAY = shutil.which("ray")
START_TIMEOUT_S = 60   # one `ray start`
RUN_TIMEOUT_S = 90     # one driver run or job submission, actor start-up included

def _free_ports(n: int) -> list[int]:
    """Ports free on loopback right now (in a private namespace every port is free; these are just unused)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _private_netns() -> subprocess.Popen | None:
    """A process holding a fresh network namespace with loopback up, or None where that is not allowed."""
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("nsenter") and shutil.which("ip")):
        return None
    holder = subprocess.Popen(["unshare", "--net", "sh", "-c", "ip link set lo up && exec sleep 600"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    own = os.readlink("/proc/self/ns/net")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and holder.poll() is None:
        try:
            if os.readlink(f"/proc/{holder.pid}/ns/net") != own and \
                    "sleep" in Path(f"/proc/{holder.pid}/cmdline").read_text():
                return holder  # exec'd into `sleep`, so lo is up
        except OSError:
            pass
        time.sleep(0.05)
    holder.kill()
    holder.wait()
    return None


def _process_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, state, command line), from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        table[int(entry)] = (int(stat[1]), stat[0], cmd)
    return table


def _kill_cluster(marks: list[str], extra_pids: list[int]) -> list[int]:
    """End the processes whose command line contains one of ``marks``, plus ``extra_pids``, and all their
    descendants: SIGTERM, then SIGKILL for what is still running after 5 s.  Returns the pids signalled."""
    table = _process_table()
    chosen = {pid for pid, (_, _, cmd) in table.items() if any(m in cmd for m in marks)}
    chosen |= {p for p in extra_pids if p in table}
    grew = True
    while grew:  # descendants: workers and agents under the raylets, dashboard modules, the job's driver
        children = {pid for pid, (ppid, _, _) in table.items() if ppid in chosen} - chosen
        chosen |= children
        grew = bool(children)
    chosen.discard(os.getpid())

    def running(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in chosen:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(running(p) for p in chosen):
            time.sleep(0.1)
    return sorted(chosen)


class Cluster:
    """A running two-node cluster: where to reach it and how to run commands next to it."""

    def __init__(self, temp: Path, prefix: list[str], env: dict[str, str], gcs_port: int, dashboard_port: int):
        self.temp, self.prefix, self.env = temp, prefix, env
        self.gcs_port, self.dashboard_port = gcs_port, dashboard_port
        self.gcs_address = f"127.0.0.1:{gcs_port}"
        self.dashboard_url = f"http://127.0.0.1:{dashboard_port}"

    def run(self, args: list[str], timeout: float) -> subprocess.CompletedProcess:
        """Run a command in the cluster's network namespace and environment, from the repository root."""
        try:
            proc = subprocess.run(self.prefix + args, cwd=REPO, env=self.env, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
            pytest.fail(f"{' '.join(args[:4])} ... did not finish in {timeout:.0f}s; output so far:\n{out[-3000:]}")
        return proc


@pytest.fixture(scope="module")
def cluster():
    assert RAY, "the `ray` command line is missing: ray is a casync dependency, reinstall with pip install -e ."
    # A short temp root rather than tmp_path: Ray puts unix sockets under it and sun_path holds 107 bytes.
    temp = Path(tempfile.mkdtemp(prefix="casync-rc-"))
    holder = _private_netns()
    prefix = ["nsenter", f"--net=/proc/{holder.pid}/ns/net", "--"] if holder else []
    gcs, dash, client, agent_head, agent_node, dash_metrics, autoscaler_metrics = _free_ports(7)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(
        RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32),   # one token for nodes, drivers and the job CLI
        RAY_USAGE_STATS_ENABLED="0",
        # the dashboard's and autoscaler's Prometheus endpoints use fixed ports (44227, 44217) unless told otherwise
        DASHBOARD_METRIC_PORT=str(dash_metrics), AUTOSCALER_METRIC_PORT=str(autoscaler_metrics),
    )
    c = Cluster(temp, prefix, env, gcs, dash)
    common = ["--num-cpus=1", "--object-store-memory=80000000", "--disable-usage-stats"]
    try:
        head = c.run([RAY, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={gcs}",
                      f"--temp-dir={temp / 'head'}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                      f"--dashboard-port={dash}", f"--ray-client-server-port={client}",
                      f"--dashboard-agent-listen-port={agent_head}", *common], START_TIMEOUT_S)
        assert head.returncode == 0, "ray start --head failed:\n" + head.stdout[-3000:] + head.stderr[-3000:]
        node = c.run([RAY, "start", f"--address=127.0.0.1:{gcs}", f"--temp-dir={temp / 'node'}",
                      f"--dashboard-agent-listen-port={agent_node}", *common], START_TIMEOUT_S)
        assert node.returncode == 0, "ray start --address failed:\n" + node.stdout[-3000:] + node.stderr[-3000:]
        yield c
    finally:
        # Processes without the temp dir in their command line (the Ray Client server) name the GCS address, as
        # the head registered it: 127.0.0.1 in the namespace, the machine's address outside it.
        marks = [str(temp), f"127.0.0.1:{gcs}"]
        registered = temp / "head" / "ray_current_cluster"
        if registered.exists():
            marks.append(registered.read_text().strip())
        _kill_cluster(marks, [holder.pid] if holder else [])
        if holder:
            holder.wait(timeout=10)
        shutil.rmtree(temp, ignore_errors=True)


def test_cluster_yaml_passes_ray_up_config_checks():
    """examples/cluster.yaml goes through the steps `ray up` takes before it contacts any machine: defaults of the
    local provider merged in, Ray's JSON schema, provider bootstrap.  Its addresses are placeholders, never used."""
    yaml = pytest.importorskip("yaml")
    pytest.importorskip("jsonschema")
    from ray.autoscaler._private.commands import _bootstrap_config

    config = yaml.safe_load((REPO / "examples" / "cluster.yaml").read_text())
    assert config["provider"]["type"] == "local" and config["provider"]["worker_ips"]
    assert {"ssh_user", "ssh_private_key"} <= set(config["auth"])
    resolved = _bootstrap_config(config, no_config_cache=True)  # raises on a schema violation
    assert resolved["provider"]["head_ip"] == config["provider"]["head_ip"]
    assert any("ray start --head --port=6379" in c for c in resolved["head_start_ray_commands"])
    assert any("ray start --address=$RAY_HEAD_IP:6379" in c for c in resolved["worker_start_ray_commands"])
    assert any("pip install" in c and "casync" in c for c in resolved["setup_commands"])


def _check_sync_output(text: str) -> None:
    assert "bitwise identical to LocalEngine: True" in text, text[-3000:]
    assert "actors on 2 distinct node(s) (placement=spread)" in text, text[-3000:]
    assert text.count("bitwise equal to LocalEngine: True") == 2, text[-3000:]  # one line per step


def test_driver_spreads_actors_over_both_nodes(cluster):
    proc = cluster.run([sys.executable, SCRIPT, "--address", cluster.gcs_address, "--workers", "2",
                        "--model", "tiny", "--steps", "2", "--timeout", "60"], RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _check_sync_output(proc.stdout)
    assert "cluster: 2 node(s)" in proc.stdout, proc.stdout


def test_job_submit_runs_the_example(cluster):
    job_id = f"casync-cluster-{secrets.token_hex(4)}"
    # the job's driver connects with the default --address auto (RAY_ADDRESS, set by the job server)
    # --working-dir ships the checkout (Ray leaves out .git and what .gitignore lists) to the job and its actors
    submit = cluster.run([RAY, "job", "submit", "--address", cluster.dashboard_url, "--submission-id", job_id,
                          "--working-dir", str(REPO), "--", sys.executable, SCRIPT, "--workers", "2",
                          "--model", "tiny", "--steps", "2", "--timeout", "60"], RUN_TIMEOUT_S)
    status = cluster.run([RAY, "job", "status", "--address", cluster.dashboard_url, job_id], 30)
    logs = cluster.run([RAY, "job", "logs", "--address", cluster.dashboard_url, job_id], 30)
    detail = f"submit:\n{submit.stdout[-3000:]}{submit.stderr[-2000:]}\nstatus:\n{status.stdout}{status.stderr}"
    assert f"Job '{job_id}' succeeded" in status.stdout, detail  # the CLI's words for JobStatus.SUCCEEDED
    assert submit.returncode == 0, detail
    _check_sync_output(logs.stdout)
    where = [line for line in logs.stdout.splitlines() if line.startswith("casync from ")]
    assert where and "_ray_pkg_" in where[0], logs.stdout[-3000:]  # the job imported the uploaded checkout
