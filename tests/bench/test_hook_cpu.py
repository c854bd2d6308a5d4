"""benchmarks/hook_cpu.py: its thread accounting and summary, and the script end to end on 2 tiny gloo ranks."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import load_benchmark

load_benchmark("result_files")  # what the script imports as a sibling
hcpu = load_benchmark("hook_cpu")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "hook_cpu.py"


def test_thread_kinds_leave_the_peers_and_steps_out():
    assert hcpu.thread_kind("casync-send-worker:0->worker:1") == "casync-send"
    assert hcpu.thread_kind("casync-step-14") == "casync-step"
    assert hcpu.thread_kind("MainThread") == "MainThread"


def test_a_busy_threads_cpu_is_counted_under_its_own_id():
    go, burned, done = threading.Event(), threading.Event(), threading.Event()

    def burn() -> None:  # 0.2 s of its own CPU between the two readings, however loaded the machine is
        go.wait()
        end = time.thread_time() + 0.2
        while time.thread_time() < end:
            pass
        burned.set()
        done.wait()

    t = threading.Thread(target=burn)
    t.start()
    time.sleep(0.01)
    before = hcpu.thread_cpu()
    go.set()
    burned.wait(60)
    after = hcpu.thread_cpu()
    done.set()
    t.join()
    assert after[t.native_id] - before[t.native_id] >= 0.15  # /proc counts in clock ticks (10 ms)


def test_the_summary_averages_ranks_and_sets_each_variant_beside_no_communication():
    def rank(cpu: float, ops: float | None) -> dict:
        return {"ddp-nocomm": dict(process_s=0.030, wall_s=0.06, ops_s=None, threads_s={"MainThread": 0.03}),
                "ring/onebit": dict(process_s=cpu, wall_s=0.2, ops_s=ops, threads_s={"casync-send": 0.004})}

    rows = {r["variant"]: r for r in hcpu.summarize([rank(0.070, 0.030), rank(0.090, 0.034)])}
    assert rows["ddp-nocomm"]["beyond_floor_ms"] == 0.0 and rows["ddp-nocomm"]["ops_cpu_ms"] is None
    assert rows["ring/onebit"]["cpu_ms"] == pytest.approx(80.0)
    assert rows["ring/onebit"]["beyond_floor_ms"] == pytest.approx(50.0)
    assert rows["ring/onebit"]["ops_cpu_ms"] == pytest.approx(32.0)
    assert rows["ring/onebit"]["threads_ms"] == {"casync-send": 4.0}


def test_the_script_accounts_a_hook_ranks_cpu(tmp_path):
    """Two tiny ranks: every variant has CPU, the hook's ops are part of its CPU, its data plane's threads and its
    per-step thread are counted, and the report names the command."""
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny", "--workers", "2", "--iters", "3",
                    "--variants", "ddp-nocomm,ring/onebit", "--out", str(out)], check=True, timeout=300,
                   capture_output=True)
    rows = {r["variant"]: r for r in json.loads((out / "hook_cpu.json").read_text())["rows"]}
    assert set(rows) == {"ddp-nocomm", "ring/onebit"}
    hook = rows["ring/onebit"]
    assert rows["ddp-nocomm"]["cpu_ms"] > 0 and hook["cpu_ms"] > 0
    assert 0 < hook["ops_cpu_ms"] <= hook["cpu_ms"]
    assert hook["beyond_floor_ms"] == pytest.approx(hook["cpu_ms"] - rows["ddp-nocomm"]["cpu_ms"], abs=0.11)
    assert "MainThread" in hook["threads_ms"] and "casync-send" in hook["threads_ms"]
    assert "python benchmarks/hook_cpu.py --model tiny" in (out / "hook_cpu.md").read_text()


def test_the_task_mode_splits_a_training_step_and_times_the_hooks_phases(tmp_path):
    """Two ranks train the image task (a tiny IDX set) with the floor and top-k + DGC: every part of the step has
    CPU, the keepers' and the runner's phases are timed (clipping inside clip + momentum), the ops' CPU is split by
    op, and the split table names them beside the floor."""
    from tests.bench.test_tta import _idx

    images = tmp_path / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 64), ("t10k", 32)):
        _idx(images / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 255, size=(n, 8, 8)))
        _idx(images / f"{split}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(SCRIPT), "--task", "image", "--data", str(images), "--workers", "2",
                    "--iters", "2", "--variants", "nocomm,allgather/topk1%+dgc", "--out", str(out)], check=True,
                   timeout=600, capture_output=True)
    rows = {r["variant"]: r for r in json.loads((out / "hook_cpu.json").read_text())["rows"]}
    floor, topk = rows["nocomm"], rows["allgather/topk1%+dgc"]
    for row in (floor, topk):
        assert all(row["parts_ms"][p] > 0 for p in ("data", "forward", "backward", "optimizer"))
    assert not any(k.startswith("phase") for k in floor["parts_ms"]) and floor["op_ms"] == {}
    phases = topk["parts_ms"]
    assert 0 < phases["phase keepers: clip"] <= phases["phase keepers: clip + momentum"]
    assert phases["phase keepers: finish (masking)"] > 0 and phases["phase runner: run (the ops)"] > 0
    assert topk["op_ms"]["encode"] > 0 and topk["op_ms"]["merge"] > 0
    assert topk["beyond_floor_ms"] == pytest.approx(topk["cpu_ms"] - floor["cpu_ms"], abs=0.11)
    assert topk["buckets"]["as_planned"] >= 1
    text = (out / "hook_cpu.md").read_text()
    assert "| phase keepers: finish (masking) |" in text and "| op encode |" in text and "--task image" in text
