"""The command line and the quickstart example, run as a user would."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from casync.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_plan_prints_summary_and_writes_pictures(tmp_path, capsys):
    dot, png = tmp_path / "plan.dot", tmp_path / "plan.png"
    assert main(["plan", "--model", "resnet50", "--workers", "8", "--strategy", "ring", "--codec", "onebit",
                 "--dot", str(dot), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "SyncPlan: 161 tensors" in out and "onebit+ef" in out and "TOTAL" in out
    assert dot.read_text().startswith("digraph")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_plan_table_for_one_bucket(capsys):
    assert main(["plan", "--model", "tiny", "--workers", "2", "--strategy", "ps", "--servers", "1",
                 "--codec", "topk:ratio=0.5", "--table"]) == 0
    out = capsys.readouterr().out
    assert "server:0" in out and "recv" in out


@pytest.mark.parametrize("argv,needle", [
    (["plan", "--model", "nosuchmodel"], "nosuchmodel"),
    (["plan", "--model", "tiny", "--codec", "zip"], "zip"),
    (["plan", "--model", "tiny", "--strategy", "tree"], "tree"),
    (["plan", "--model", "tiny", "--workers", "0"], "workers"),
    (["train", "--steps", "-5", "--no-progress"], "--steps"),  # was refused only after Ray had started
    (["train", "--epochs", "-1", "--no-progress"], "--epochs"),
])
def test_bad_arguments_exit_2_with_message(argv, needle, capsys):
    assert main(argv) == 2
    assert needle in capsys.readouterr().err


def test_models_and_codecs_listings(capsys):
    assert main(["models"]) == 0 and "25,557,032" in capsys.readouterr().out
    assert main(["codecs"]) == 0 and "randomk" in capsys.readouterr().out


def test_python_dash_m_and_quickstart(tmp_path):
    run = subprocess.run([sys.executable, "-m", "casync", "plan", "--model", "vgg16", "--workers", "3",
                          "--strategy", "allgather", "--codec", "topk:ratio=0.01"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "32 tensors" in run.stdout
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py"), "--out", str(tmp_path)],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "replicas identical: True" in run.stdout
    assert (tmp_path / "plan.png").exists() and (tmp_path / "plan.dot").exists()


def test_profile_quick_writes_a_loadable_profile(tmp_path, capsys):
    import casync

    out = tmp_path / "p.json"
    assert main(["profile", "--quick", "--no-transfer", "--no-progress", "--out", str(out)]) == 0
    profile = casync.Profile.load(out)
    assert "onebit" in profile.codecs and profile.merge.b > 0
    assert "encode GB/s" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--calibration-workers", "4"], "add --calibrate-ray"),
    (["--netem", "links.env"], "add --calibrate-ray"),
    (["--calibrate-ray", "--calibration-workers", "1"], "at least 2"),
])
def test_profile_calibration_options_are_checked_before_anything_runs(argv, message, tmp_path, capsys):
    """Options that only shape --calibrate-ray are refused at once (not after minutes of profiling)."""
    started = time.monotonic()
    assert main(["profile", "--no-progress", "--out", str(tmp_path / "p.json"), *argv]) == 2
    assert message in capsys.readouterr().err and time.monotonic() - started < 5
    assert not (tmp_path / "p.json").exists()


def test_simulate_critical_path_split_fits_in_the_iteration(capsys):
    """Compute + transfers on the critical path were summed over overlapping ops (47.4 ms for a 37.5 ms
    iteration with 4 workers per node)."""
    import re

    assert main(["simulate", "--model", "resnet50", "--workers", "8", "--workers-per-node", "4",
                 "--bandwidth", "25"]) == 0
    out = capsys.readouterr().out
    iteration = float(re.search(r"simulated iteration time: ([\d.]+) ms", out).group(1))
    compute, transfer = map(float, re.search(r"critical path: \d+ ops \(([\d.]+) ms compute, ([\d.]+) ms transfers",
                                             out).groups())
    assert compute + transfer <= iteration + 0.1


def test_profile_refuses_an_unusable_out_before_measuring(tmp_path, capsys):
    """--out naming a directory was refused only when the profile was saved, after minutes of measuring."""
    started = time.monotonic()
    assert main(["profile", "--no-progress", "--no-transfer", "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err and time.monotonic() - started < 5


def test_a_reader_that_stops_early_ends_the_command_quietly():
    """`casync plan --table | head -1` printed "casync: error: [Errno 32] Broken pipe" and exited 2."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "casync", "plan", "--model", "resnet50", "--workers", "16",
                             "--table"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"SyncPlan:")
    proc.stdout.close()  # far more than a pipe's buffer is still to come
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141 and err == b"", err
