"""The flake hunt itself: it repeats what it is given and counts a test that fails now and then."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.tools.flake_hunt import base_id, main

ROOT = Path(__file__).resolve().parents[2]

FLAKY = '''
import pathlib, pytest

@pytest.mark.parametrize("size", ["8-of-20"])
def test_every_other_run_fails(size, tmp_path_factory):
    counter = pathlib.Path(__file__).with_suffix(".count")
    n = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(n + 1))
    assert n % 2 == 0

def test_steady():
    assert True

def test_skipped_here():
    pytest.skip("needs CUDA")
'''


def test_base_id_drops_only_the_repeat_index():
    assert base_id("t.py::test_a[8-of-20-hunt3]") == "t.py::test_a[8-of-20]"
    assert base_id("t.py::test_a[hunt0]") == "t.py::test_a"
    assert base_id("t.py::test_a[hunt12-x]") == "t.py::test_a[x]"
    assert base_id("t.py::test_a") == "t.py::test_a"


def test_a_test_failing_every_other_run_is_counted(tmp_path):
    (tmp_path / "test_sample.py").write_text(FLAKY)
    ids = tmp_path / "ids.txt"
    ids.write_text("test_sample.py::test_every_other_run_fails[8-of-20]\ntest_sample.py::test_steady\n"
                   "test_sample.py::test_skipped_here\n")
    run = subprocess.run([sys.executable, "-m", "tests.tools.flake_hunt", "--tests", str(ids), "--runs", "4",
                          "--out", str(tmp_path / "hunt.json"), "--markdown", str(tmp_path / "hunt.md")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 1, run.stdout + run.stderr  # something failed
    report = json.loads((tmp_path / "hunt.json").read_text())
    tests = report["tests"]
    assert report["not_repeated"] == ["test_sample.py::test_skipped_here"]  # said, not silently dropped
    assert "not repeated (skipped or not collected): test_sample.py::test_skipped_here" in run.stdout
    assert tests["test_sample.py::test_every_other_run_fails[8-of-20]"]["runs"] == 4
    assert tests["test_sample.py::test_every_other_run_fails[8-of-20]"]["failures"] == 2
    assert tests["test_sample.py::test_steady"] == {**tests["test_sample.py::test_steady"], "runs": 4, "failures": 0}
    assert "| `test_sample.py::test_every_other_run_fails[8-of-20]` | 4 | 2 |" in (tmp_path / "hunt.md").read_text()
    assert set(report["load"]) == {"min", "mean", "max"} and report["load"]["max"] >= report["load"]["min"] >= 0

    # a hunt made in pieces adds up: twice this one is 8 runs and 4 failures of the flaky test
    hunt = str(tmp_path / "hunt.json")
    code = main(["--merge", hunt, hunt, "--out", str(tmp_path / "all.json"), "--markdown", str(tmp_path / "all.md")])
    merged = json.loads((tmp_path / "all.json").read_text())
    assert code == 1 and merged["runs"] == 8 and len(merged["parts"]) == 2
    assert merged["tests"]["test_sample.py::test_every_other_run_fails[8-of-20]"]["runs"] == 8
    assert merged["tests"]["test_sample.py::test_every_other_run_fails[8-of-20]"]["failures"] == 2 * 2
    assert merged["tests"]["test_sample.py::test_steady"]["failures"] == 0
    assert merged["not_repeated"] == ["test_sample.py::test_skipped_here"]
    assert "| `test_sample.py::test_every_other_run_fails[8-of-20]` | 8 | 4 |" in (tmp_path / "all.md").read_text()


def test_the_suites_conftest_loads_without_xdist():
    """The hunt runs pytest in one process (-p no:xdist): the suite's conftest must not require xdist's hooks."""
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                          "tests/tools/test_flake_hunt.py::test_base_id_drops_only_the_repeat_index"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
