"""The time-to-accuracy mode (``casync tta``): the target and time to target on hand-made curves, the table, the
configuration registry, clear errors before any rank starts, and tiny real runs on 2 gloo ranks (a few steps of
the image task on a small IDX set written here)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from casync.bench.setup import local_setup
from casync.bench.tta import configs as registry
from casync.bench.tta.configs import CONFIGS, Config, resolve, run_options
from casync.bench.tta.curves import reference_target, summarize, sync_share, target_step, time_to_target
from casync.bench.tta.report import table, text_summary, write_report
from casync.bench.tta.runner import eval_steps, run_tta
from casync.tasks.schedules import lr_factor
from casync.cli import main
import casync.tasks.image as image_task
from casync.tasks import get_task


def _run(config: str, seed: int, curve: list[tuple[int, float, float | None]], **extra) -> dict:
    return {"config": config, "seed": seed, "points": [{"step": s, "seconds": t, "metric": m} for s, t, m in curve],
            "steps_done": curve[-1][0] if curve else 0, "train_seconds": curve[-1][1] if curve else 0.0,
            "nonfinite": None, "error": None, "consistent": True, "wire_bytes_per_step": 1e6, **extra}


# -- target and time to target, by hand ------------------------------------------------------------------------------

def test_target_is_the_reference_mean_at_its_target_step_and_time_to_target_the_first_point_reaching_it():
    assert target_step(10) == 8 and target_step(4) == 3 and target_step(1) == 1
    assert eval_steps(10, 4) == [4, 8, 10] and eval_steps(4, 2) == [2, 3, 4]
    acc = [_run("allreduce", 0, [(4, 1.0, 0.50), (8, 2.0, 0.70), (10, 2.5, 0.72)]),
           _run("allreduce", 1, [(4, 1.2, 0.55), (8, 2.4, 0.80), (10, 3.0, 0.81)])]
    target = reference_target(acc, 8)
    assert target == pytest.approx(0.75)
    tt = time_to_target(acc, target, higher_is_better=True)  # seed 0 reaches 0.75 never, seed 1 at step 8
    assert tt["seconds"] is None and tt["reached"] == 1 and tt["seeds"] == 2
    assert tt["per_seed"] == [None, {"seed": 1, "step": 8, "seconds": 2.4}]
    fast = [_run("ring/onebit", 0, [(4, 0.5, 0.76), (8, 1.0, 0.8)]),
            _run("ring/onebit", 1, [(4, 0.4, 0.6), (8, 0.9, 0.75)])]
    tt = time_to_target(fast, target, True)  # 0.75 counts as reached (>=)
    assert tt["seconds"] == pytest.approx((0.5 + 0.9) / 2) and tt["steps"] == 6 and tt["reached"] == 2


def test_a_loss_is_reached_from_above_and_a_missing_or_non_finite_reference_point_is_no_target():
    loss = [_run("allreduce", 0, [(5, 1.0, 3.0), (8, 1.6, 2.0), (10, 2.0, 1.9)])]
    assert reference_target(loss, 8) == 2.0
    tt = time_to_target([_run("x", 0, [(5, 0.4, 2.5), (8, 0.7, 1.99)])], 2.0, higher_is_better=False)
    assert tt["seconds"] == 0.7 and tt["steps"] == 8
    assert time_to_target([_run("x", 0, [(5, 0.4, float("nan")), (8, 0.7, 2.01)])], 2.0, False)["reached"] == 0
    with pytest.raises(ValueError, match="no metric at step 8.*--target"):
        reference_target([_run("allreduce", 0, [(5, 1.0, 3.0), (8, 1.6, None)],
                               nonfinite={"step": 6, "rank": 1})], 8)
    with pytest.raises(ValueError, match="no allreduce run"):
        reference_target([], 8)


def _summary_result(rows: list[dict], target: float | None, higher: bool = True) -> dict:
    names = list(dict.fromkeys(r["config"] for r in rows))
    configs = [CONFIGS[n] for n in names]
    return {"task": {"metric": "top-1 accuracy", "higher_is_better": higher},
            "target": {"value": target, "source": "x"}, "summary": summarize(rows, configs, target, 10, higher)}


def test_table_rows_say_speed_ups_never_reached_non_finite_and_the_floor():
    runs = [_run("allreduce", s, [(5, 4.0, 0.6), (8, 6.0, 0.70 + s / 100), (10, 8.0, 0.72 + s / 100)]) for s in (0, 1)]
    runs += [_run("powersgd-r1", s, [(5, 2.0, 0.69), (8, 3.0, 0.71), (10, 4.0, 0.715)]) for s in (0, 1)]
    runs += [_run("ring/onebit", s, [(5, 1.0, 0.71), (8, 1.5, 0.73), (10, 2.0, 0.74)]) for s in (0, 1)]
    runs += [_run("fp16", 0, [(5, 3.0, 0.5), (8, 4.0, 0.6), (10, 5.0, 0.65)]),  # never reaches the target
             _run("fp16", 1, [(5, 3.0, 0.5), (8, 4.0, 0.6)], nonfinite={"step": 9, "rank": 1}, steps_done=10)]
    runs += [_run("nocomm", s, [(5, 0.5, None), (10, 1.0, None)], consistent=None) for s in (0, 1)]
    result = _summary_result(runs, target=0.705)
    headers, body = table(result)
    assert headers == ["configuration", "system", "final top-1 accuracy (mean ± sd)", "Δ vs allreduce",
                       "time to target s", "steps to target", "× DDP allreduce", "× fastest PyTorch hook",
                       "wire MB/step", "step ms"]
    rows = {r[0]: dict(zip(headers, r)) for r in body}
    assert rows["allreduce"]["final top-1 accuracy (mean ± sd)"] == "0.7250 ± 0.0071"
    assert rows["allreduce"]["time to target s"] == 7.0 and rows["allreduce"]["× DDP allreduce"] == 1.0
    # PowerSGD r1 reaches 0.705 at 3 s in both seeds: the fastest PyTorch hook; ring/onebit at 1 s
    assert rows["ring/onebit"]["× DDP allreduce"] == 7.0 and rows["ring/onebit"]["× fastest PyTorch hook"] == 3.0
    assert rows["ring/onebit"]["Δ vs allreduce"] == "+0.0150" and rows["ring/onebit"]["steps to target"] == 5
    assert rows["fp16"]["time to target s"] == "not reached (0 of 2 seeds)" and rows["fp16"]["× DDP allreduce"] == ""
    assert rows["fp16"]["final top-1 accuracy (mean ± sd)"] == "0.6500 ± 0.0000 (1 of 2 seeds)"
    assert rows["nocomm"]["final top-1 accuracy (mean ± sd)"] == "n/a (replicas diverge)"
    assert rows["nocomm"]["step ms"] == 100.0 and rows["ring/onebit"]["wire MB/step"] == 1.0
    fp16 = next(r for r in result["summary"] if r["config"] == "fp16")
    assert fp16["problems"] == ["seed 1: non-finite loss at step 9 (rank 1); stopped at step 10"]
    assert next(r for r in result["summary"] if r["config"] == "ring/onebit")["fastest_hook"] == "powersgd-r1"
    assert sync_share(result["summary"]) == pytest.approx(1 - 0.1 / 0.8)  # allreduce 800 ms a step, the floor 100
    # the same runs against a target nobody reaches: said in the table, no exception
    rows = {r[0]: r for r in table(_summary_result(runs, target=0.99))[1]}
    assert rows["allreduce"][4] == "not reached (0 of 2 seeds)" and rows["ring/onebit"][6:8] == ["", ""]


# -- the registry ----------------------------------------------------------------------------------------------------

def test_configurations_are_named_clearly_and_one_this_casync_cannot_run_is_refused_saying_why(monkeypatch):
    assert [c.name for c in resolve(["allreduce", "ring/onebit"], "image")] == ["allreduce", "ring/onebit"]
    defaults = [c.name for c in resolve(None, "image")]
    assert defaults[0] == "allreduce" and "nocomm" in defaults and "onebit-adam" not in defaults  # (an lm config)
    with pytest.raises(ValueError, match="unknown configuration.*'sideways'.*choose from allreduce"):
        resolve(["sideways"], "lm")
    with pytest.raises(ValueError, match="is for the lm task, not 'image'"):
        resolve(["onebit-adam"], "image")
    with pytest.raises(ValueError, match="named twice"):
        resolve(["allreduce", "allreduce"], "lm")
    keeper = Config("future", "casync hook", "a keeper not written yet", variant="ddp-casync:ring:onebit",
                    options={"no_such_keeper": 1})
    monkeypatch.setitem(registry.CONFIGS, "future", keeper)
    with pytest.raises(ValueError, match=r"'future' needs CasyncState option\(s\) \['no_such_keeper'\]"):
        resolve(["future"], "lm")
    assert "future" not in [c.name for c in resolve(None, "lm")]
    assert run_options({"warmup_steps": "10%", "local_compensation": "lr", "codec": "onebit"}, 50, 0.05) == \
        {"warmup_steps": 5, "local_compensation": 0.05, "codec": "onebit"}


# -- clear errors, before any rank starts ----------------------------------------------------------------------------

@pytest.mark.parametrize("argv, needle", [
    (["tta", "--task", "sideways"], "unknown task 'sideways'; choose one of image, lm"),
    (["tta", "--task", "lm", "--data", "/no/such/corpus"], "--data '/no/such/corpus': no such file or folder"),
    (["tta", "--task", "image", "--configs", "ring/onebit", "fp16"], "add allreduce to --configs, or give --target"),
    (["tta", "--task", "image", "--configs", "allreduce", "--ranks", "1"], "--ranks must be >= 2"),
    (["tta", "--task", "image", "--configs", "allreduce", "--seeds", "1", "1"], "distinct seeds"),
])
def test_bad_input_exits_2_with_one_line(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_on_the_emulated_cluster_each_rank_needs_a_node_of_its_own(tmp_path, capsys):
    """``netem.sh run --job tta -- ...`` hands the mode its links.env; more ranks than nodes are refused at once."""
    links = tmp_path / "links.env"
    links.write_text("nodes=2\nrate=1gbit\nhead=10.77.0.1\n")
    assert main(["tta", "--task", "image", "--configs", "allreduce", "--netem", str(links), "--ranks", "4"]) == 2
    assert "the emulated cluster has 2 nodes; 4 ranks need one node each" in capsys.readouterr().err


# -- tiny real runs ----------------------------------------------------------------------------------------------------

def _idx(path, array: np.ndarray) -> None:
    """One IDX file (unsigned bytes) as the image task reads them."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


@pytest.fixture(scope="module")
def tiny_images(tmp_path_factory):
    """64 training and 32 test 8x8 images of 10 classes (class k: a bright row k % 8), as IDX files."""
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for split, n in (("train", 64), ("t10k", 32)):
        labels = np.arange(n) % 10
        images = rng.integers(0, 60, size=(n, 8, 8))
        images[np.arange(n), labels % 8, :] = 255
        _idx(folder / f"{split}-images-idx3-ubyte.gz", images)
        _idx(folder / f"{split}-labels-idx1-ubyte.gz", labels)
    return folder


@pytest.fixture(scope="module")
def tiny_result(tiny_images):
    """One real comparison on 2 gloo ranks, 4 steps, evaluated at every step: a configuration that fails (its ranks
    end; the others go on in fresh ones), allreduce, ring/onebit, and allreduce at a learning rate of 1e30."""
    broken = Config("broken", "casync hook", "a hook option no CasyncState takes", variant="ddp-casync:ring:onebit",
                    options={"error_feedback": "sideways"})
    diverging = Config("diverging", "torch hook", "allreduce at a learning rate of 1e30", variant="ddp",
                       param_groups={"lr": 1e30})
    return run_tta(get_task("image"), [broken, CONFIGS["allreduce"], CONFIGS["ring/onebit"], diverging,
                                               CONFIGS["cdsgd/onebit"]], seeds=[0],
                   steps=4, ranks=2, eval_every=1, setup=local_setup(), data=str(tiny_images), batch_size=4,
                   schedule="cosine", progress=False, command="casync tta (test)")


def test_a_tiny_comparison_writes_the_table_json_and_plots(tiny_result, tmp_path):
    result = tiny_result
    assert set(result) >= {"format", "command", "commit", "machine", "setup", "task", "protocol", "target", "configs",
                           "runs", "summary", "sync_share", "seconds"}
    assert result["setup"]["kind"] == "local" and result["task"]["lr"] == get_task("image").defaults["lr"] \
        and result["task"]["batch_size"] == 4  # no --lr: the task's tuned default
    assert result["task"]["manifest"]["train"] == 64 and len(result["task"]["manifest"]["sha256"]) == 64
    assert result["protocol"] == {"steps": 4, "seeds": [0], "ranks": 2, "eval_steps": [1, 2, 3, 4], "target_step": 3,
                                  "reference": "allreduce"}
    runs = {r["config"]: r for r in result["runs"]}
    assert [p["step"] for p in runs["allreduce"]["points"]] == [1, 2, 3, 4]
    assert result["target"]["value"] == runs["allreduce"]["points"][2]["metric"]
    for run in (runs["allreduce"], runs["ring/onebit"], runs["cdsgd/onebit"]):  # cdsgd: after its pending update
        assert run["error"] is None and run["nonfinite"] is None and run["consistent"] is True
        assert run["steps_done"] == 4 and run["train_seconds"] > 0
        # cosine over 4 steps: step 4 trains at lr * (1 + cos(3 pi / 4)) / 2 = 0.1464 lr
        assert run["last_lr"] == pytest.approx(result["task"]["lr"] * 0.1464466, rel=1e-6)
        assert all(0 <= p["metric"] <= 1 for p in run["points"])
        assert [p["seconds"] for p in run["points"]] == sorted(p["seconds"] for p in run["points"])
    hidden = image_task.HIDDEN
    numel = 128 * hidden + hidden + hidden * 10 + 10 + 16 * 25 + 16 + 32 * 16 * 25 + 32  # the CNN on 8x8 images
    assert runs["allreduce"]["wire_bytes_per_step"] == 2 * 1 * 4 * numel  # 2 (N-1) x the float32 gradient
    assert 0 < runs["ring/onebit"]["wire_bytes_per_step"] < runs["allreduce"]["wire_bytes_per_step"] / 16
    assert runs["ring/onebit"]["options"] == {"error_feedback": True} and result["sync_share"] is None
    written = write_report(result, tmp_path)
    md = (tmp_path / "tta.md").read_text()
    assert "| allreduce | torch hook |" in md and "| ring/onebit | casync hook |" in md and "× DDP allreduce" in md
    assert json.loads((tmp_path / "tta.json").read_text())["runs"][1]["points"] == runs["allreduce"]["points"]
    assert all((tmp_path / name).stat().st_size > 0 for name in ("tta_step.png", "tta_time.png"))
    assert written["plots"] == [str(tmp_path / "tta_step.png"), str(tmp_path / "tta_time.png")]
    assert text_summary(result).startswith("target: top-1 accuracy")


def test_learning_rate_schedules_by_hand():
    cosine, constant = lr_factor("cosine", 4), lr_factor("constant", 4)
    assert [round(cosine(k), 6) for k in range(5)] == [1.0, 0.853553, 0.5, 0.146447, 0.0]
    assert [constant(k) for k in range(5)] == [1.0] * 5
    with pytest.raises(ValueError, match="unknown learning-rate schedule 'step'; choose one of constant, cosine"):
        lr_factor("step", 4)


def test_a_failing_run_is_recorded_the_rest_go_on_and_a_non_finite_loss_stops_its_run(tiny_result):
    runs = {r["config"]: r for r in tiny_result["runs"]}
    failed, diverging = runs["broken"], runs["diverging"]
    assert "error_feedback" in failed["error"] and failed["points"] == [] and failed["steps_done"] == 0
    # the loss went non-finite: learnt at the evaluation point after it (here every step), where the run stopped
    bad = diverging["nonfinite"]
    assert bad is not None and diverging["steps_done"] == bad["step"] < 4 and diverging["error"] is None
    assert diverging["points"][-1]["metric"] is None and len(diverging["points"]) == bad["step"]
    rows = {r["config"]: r for r in tiny_result["summary"]}
    assert "non-finite loss at step" in rows["diverging"]["problems"][0]
    assert rows["broken"]["problems"][0].startswith("seed 0: failed:")
    headers, body = table(tiny_result)
    assert [r[0] for r in body] == ["broken", "allreduce", "ring/onebit", "diverging", "cdsgd/onebit"]
    assert body[0][2] == "failed: see below"


def test_the_command_line_runs_the_comparison_it_names_and_writes_its_report(tiny_result, tmp_path, monkeypatch,
                                                                            capsys):
    """The command line's plumbing (the comparison itself is the fixture's, run once for the module)."""
    from casync.bench.tta import runner

    asked = {}

    def fake_run_tta(task, configs, **kwargs):
        asked.update(kwargs, task=task.name, configs=[c.name for c in configs])
        return tiny_result

    monkeypatch.setattr(runner, "run_tta", fake_run_tta)
    out = tmp_path / "out"
    code = main(["tta", "--task", "image", "--data", "/", "--configs", "allreduce,ring/onebit", "--seeds", "0",
                 "--steps", "4", "--eval-every", "1", "--ranks", "2", "--batch-size", "4", "--out", str(out),
                 "--no-progress"])
    assert code == 1  # a run failed (the fixture's broken configuration)
    assert asked["task"] == "image" and asked["configs"] == ["allreduce", "ring/onebit"] and asked["seeds"] == [0]
    assert (asked["steps"], asked["eval_every"], asked["ranks"], asked["batch_size"], asked["lr"], asked["data"]) == \
        (4, 1, 2, 4, None, "/")
    assert asked["command"] == ("casync tta --task image --data / --configs allreduce ring/onebit --seeds 0 --steps 4 "
                                f"--ranks 2 --eval-every 1 --batch-size 4 --out {out}")
    captured = capsys.readouterr()
    assert "target: top-1 accuracy" in captured.out and f"table: {out / 'tta.md'}" in captured.out
    assert "1 run(s) failed" in captured.err and (out / "tta.json").exists()


def test_grad_norms_are_each_ranks_own_gradient_norm_and_the_clip_scales_by_root_n(tiny_images):
    """benchmarks/grad_norms.py (DGC's clipping threshold): step 0's norms are each rank's gradient norm at the
    seeded model, computed here by hand; the thresholds are the norms' quantiles x sqrt(N)."""
    import sys

    import torch

    sys.path.append(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import grad_norms

    norms = grad_norms.measure("image", 2, 3, 0, str(tiny_images))
    assert norms.shape == (3, 2) and np.all(norms > 0)
    task = get_task("image")
    data = task.load(str(tiny_images))
    for rank in range(2):
        model = task.model(data, 0)
        inputs, targets = next(task.batches(data, rank, 2, task.defaults["batch_size"], 0))
        task.loss(model, inputs, targets).backward()
        by_hand = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters())))
        assert norms[0, rank] == pytest.approx(by_hand, rel=1e-5)
    assert not np.allclose(norms[0], norms[2])  # the model moved: later steps are at other parameters
    _, raw = grad_norms.report(norms, "image", 0)
    assert raw["clips_1pct"] == pytest.approx(np.percentile(norms, 99) * 2 ** 0.5)
    assert raw["clips_10pct"] == pytest.approx(np.percentile(norms, 90) * 2 ** 0.5)
