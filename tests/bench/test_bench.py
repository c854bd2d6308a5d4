"""The strategy comparison (`casync bench`) on a tiny grid: every row in the table and the JSON, sane values.

No timing thresholds: times only have to be positive and the derived columns consistent with them.
"""
from __future__ import annotations

import json
import math
import sys

import pytest

import casync
from casync.bench.grid import Grid, plan_arguments
from casync.bench.predict import sim_plan, make_plan
from casync.bench.setup import local_setup, netem_setup, parse_rate_gbps
from casync.cli import main
from casync.sim.costmodel import ClusterModel, LinearCost, Profile, RuntimeCosts
from casync.sim.simulator import simulate

STRATEGIES = ("ps-twoway", "auto")
CODECS = ("none", "onebit")
BASELINES = ("gloo-bucket", "ddp", "ddp-fp16", "ddp-powersgd-r1", "ddp-nocomm")
HOOKS = ("ps-twoway/onebit",)


#: a profile as `casync profile --calibrate-ray` writes one: micro-benchmark costs plus a Ray runtime
CALIBRATED = Profile.default().with_runtime(RuntimeCosts(compute_scale=3.0, task_gap_s=0.003,
                                                         hop=LinearCost(0.004, 0.0), dispatch_s=0.0004))


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory, ray_local):
    out = tmp_path_factory.mktemp("bench")
    profile = CALIBRATED.save(out / "calibrated.json")
    code = main(["bench", "--models", "tiny", "--workers", "2", "--strategies", ",".join(STRATEGIES),
                 "--codecs", ",".join(CODECS), "--baselines", ",".join(BASELINES), "--hooks", ",".join(HOOKS),
                 "--sim-workers", "8",
                 "--sim-bandwidths", "1,10", "--iters", "2", "--warmup", "0", "--head-to-head", "1", "--out", str(out),
                 "--no-progress", "--profile", str(profile)])
    return code, out, json.loads((out / "bench.json").read_text())


def test_measured_rows_are_predicted_with_the_given_profile_and_the_large_grid_without_its_runtime(bench_run):
    _, out, data = bench_run
    assert str(out / "calibrated.json") in data["predicted_with"] and "calibrated" in data["predicted_with"]
    assert data["predicted_with"] in (out / "bench.md").read_text()
    row = next(r for r in data["rows"] if r["system"] == "casync" and r["strategy"] == "ps-twoway"
               and r["codec"] == "onebit")
    setup = local_setup()
    plan = make_plan("tiny", 2, "ps-twoway", "onebit", CODECS, setup.cluster_model(2))
    cluster = setup.cluster_model(2)
    assert row["predicted_s"] == pytest.approx(simulate(plan, cluster, CALIBRATED).sync_time())
    assert row["predicted_s"] > 1.5 * simulate(plan, cluster).sync_time()  # the runtime was charged
    sim = next(r for r in data["simulated"] if r["strategy"] == "ps-twoway" and r["codec"] == "onebit"
               and r["bandwidth_gbps"] == 1.0)
    cluster = ClusterModel.for_workers(8, workers_per_node=1, bandwidth_gbps=1.0)
    ideal = simulate(sim_plan("tiny", 8, "ps-twoway", "onebit", CODECS, cluster), cluster).sync_time()
    assert sim["predicted_s"] == pytest.approx(ideal)


def test_the_report_says_how_good_the_model_was_over_casync_and_hook_rows(bench_run):
    """The header's fidelity figures are those of the JSON's rows (casync and hook rows with a prediction)."""
    from casync.bench.fidelity import spearman

    _, out, data = bench_run
    assert data["calibration"] == {"source": "file", "path": str(out / "calibrated.json")}
    used = [r for r in data["rows"] if r["system"] in ("casync", "hook") and r["error"] is None and r["predicted_s"]]
    fidelity = data["model_fidelity"]["all"]
    errors = sorted(abs(r["predicted_s"] / r["sync_s"] - 1) for r in used)
    assert fidelity["rows"] == len(used) == 6 and fidelity["worst_error"] == pytest.approx(errors[-1])
    assert fidelity["median_error"] == pytest.approx((errors[2] + errors[3]) / 2)
    assert fidelity["spearman"] == pytest.approx(spearman([r["predicted_s"] for r in used], [r["sync_s"] for r in used]))
    assert f"Spearman rank correlation of predicted and measured times {fidelity['spearman']:.2f}" in \
        (out / "bench.md").read_text()


def test_bench_exits_zero_and_writes_every_artifact(bench_run):
    code, out, _ = bench_run
    assert code == 0
    report = (out / "bench.md").read_text()
    assert "no-communication floor ms" in report and "DDP, hook without communication (floor)" in report
    for name in ("bench_bars_tiny.png", "bench_sim_tiny.png", "gantt_tiny_N2_best_measured.png",
                 "gantt_tiny_N2_best_predicted.png", "gantt_tiny_N2_worst_measured.png",
                 "gantt_tiny_N2_worst_predicted.png", "gantt_tiny_N2_hook_measured.png",
                 "gantt_tiny_N2_hook_predicted.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_json_has_every_measured_row_with_sane_values(bench_run):
    _, _, data = bench_run
    rows = data["rows"]
    casync = {(r["strategy"], r["codec"]): r for r in rows if r["system"] == "casync"}
    expected = {(s, c) for s in STRATEGIES for c in CODECS} | {("auto", "auto")}
    assert set(casync) == expected
    assert {r["strategy"] for r in rows if r["system"] == "baseline"} == set(BASELINES)
    (hook,) = [r for r in rows if r["system"] == "hook"]
    assert hook["strategy"] == "ddp-casync:ps-twoway:onebit" and hook["label"] == "DDP + casync hook ps-twoway / onebit"
    assert hook["plan"] is None and hook["predicted_s"] > 0  # predicted from when DDP handed its buckets over
    # the same configuration through DDP's buckets: one bit per element on the wire, like the RayEngine row's
    assert hook["compression"] > 10 and casync[("ps-twoway", "onebit")]["compression"] > 10
    assert 0 < hook["rel_error"] < 2
    gloo = next(r for r in rows if r["strategy"] == "gloo-bucket")
    floor = next(r for r in rows if r["strategy"] == "ddp-nocomm")  # a DDP hook that communicates nothing
    assert floor["wire_bytes"] == 0 and floor["rel_error"] is None and floor["error"] is None
    assert floor["sync_s"] > 0 and len(floor["sync_all_s"]) == 2
    for r in rows:
        if r is floor:
            continue
        assert r["error"] is None, r
        assert r["model"] == "tiny" and r["workers"] == 2
        assert r["sync_s"] > 0 and len(r["sync_all_s"]) == 2 and all(t > 0 for t in r["sync_all_s"])
        assert min(r["sync_all_s"]) <= r["sync_s"] <= max(r["sync_all_s"])
        assert r["consistent"] is True
        assert 0 < r["wire_bytes"] <= r["dense_wire_bytes"]
        assert r["compression"] == pytest.approx(r["dense_wire_bytes"] / r["wire_bytes"])
    for (strategy, codec), r in casync.items():
        assert r["speedup"]["gloo-bucket"] == pytest.approx(gloo["sync_s"] / r["sync_s"])
        assert r["predicted_s"] > 0 and r["wall_s"] >= r["sync_s"]
        if codec == "none":
            assert r["compression"] == 1.0 and r["rel_error"] < 1e-6
        if codec == "onebit" and strategy != "auto":
            assert r["compression"] > 1.0 and 0 < r["rel_error"] < 2
        if strategy == "auto":
            assert r["plan"] and all(p["strategy"] in ("ps", "ring", "allgather") for p in r["plan"])
    fp16 = next(r for r in rows if r["strategy"] == "ddp-fp16")
    assert fp16["compression"] == pytest.approx(2.0) and 0 < fp16["rel_error"] < 1e-2
    assert gloo["compression"] == 1.0 and gloo["rel_error"] < 1e-6


def test_head_to_head_remeasures_the_fastest_configuration(bench_run):
    _, out, data = bench_run
    record = data["head_to_head"]["tiny/2"]
    fastest = min((r for r in data["rows"] if r["system"] == "casync"), key=lambda r: r["sync_s"])
    assert (record["strategy"], record["codec"]) == (fastest["strategy"], fastest["codec"])
    assert record["baselines"] == ["gloo-bucket", "ddp-powersgd-r1"]  # those of the head-to-head set that ran
    (only,) = record["rounds"]
    assert all(only[k] > 0 for k in ("gloo-bucket", "ddp-powersgd-r1", "casync"))
    assert record["median_speedup"]["gloo-bucket"] == pytest.approx(only["gloo-bucket"] / only["casync"])
    assert "## Head to head" in (out / "bench.md").read_text()


def test_head_to_head_remeasures_the_fastest_hook_beside_pytorchs_hooks(bench_run):
    _, out, data = bench_run
    record = data["head_to_head"]["tiny/2"]
    hook = "ddp-casync:ps-twoway:onebit"  # the only hook row, so the fastest
    assert record["hook"] == hook and record["hook_baselines"] == ["ddp", "ddp-powersgd-r1"]
    (only,) = record["rounds"]
    assert only[hook] > 0 and only["ddp"] > 0
    assert record["hook_median_speedup"]["ddp"] == pytest.approx(only["ddp"] / only[hook])
    assert record["hook_median_speedup"]["ddp-powersgd-r1"] == pytest.approx(only["ddp-powersgd-r1"] / only[hook])
    assert "### DDP + casync hook, head to head" in (out / "bench.md").read_text()


def test_the_fastest_hook_rows_timeline_holds_every_ranks_ops_beside_ddps_backward(bench_run):
    """The hook row's last timed iteration, from every rank (``CasyncState.timeline``): its ops, and the part of
    backward they ran beside, timed from the earliest rank's first hook call, as the row's sync span is."""
    _, out, data = bench_run
    record = data["timelines"]["tiny/2"]["hook"]
    hook = next(r for r in data["rows"] if r["system"] == "hook")
    assert (record["strategy"], record["codec"]) == (hook["strategy"], hook["codec"])
    rows = record["records"]
    assert {r["actor"] for r in rows} == {"worker:0", "worker:1"}
    ops = [r for r in rows if r["op"] != "backward"]
    assert {"encode", "send", "recv", "decode"} <= {r["op"] for r in ops}
    assert all(r["step"] == ops[0]["step"] and r["end"] >= r["start"] for r in rows)
    backward = [r for r in rows if r["op"] == "backward"]
    assert len(backward) == 2 and min(r["start"] for r in backward) == pytest.approx(0.0, abs=0.05)
    assert max(r["end"] for r in ops) <= max(hook["sync_all_s"]) + 0.05  # within the span the row measured
    assert (out / "gantt_tiny_N2_hook_measured.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the run-queue wait is Linux's schedstat")
def test_casync_and_hook_rows_say_where_their_op_time_went(bench_run):
    """Every casync and hook row splits one rank's op wall time into CPU, waiting for a core and blocked (the GIL);
    baselines have no ops of casync's to split.  The markdown lists the split per row."""
    _, out, data = bench_run
    for r in data["rows"]:
        split = r["op_split"]
        if r["system"] == "baseline":
            assert split is None
            continue
        assert split["ops"] > 0 and split["wall"] > 0, r["label"]
        assert min(split["cpu"], split["queued"], split["blocked"]) >= 0
        assert split["cpu"] + split["queued"] + split["blocked"] == pytest.approx(split["wall"], rel=0.02, abs=1e-4)
    text = (out / "bench.md").read_text()
    section = text.split("## Where each rank's op time went", 1)[1].split("\n## ", 1)[0]
    assert "| tiny | 2 | DDP + casync hook ps-twoway / onebit |" in section
    assert sum(line.startswith("| tiny | 2 | casync ") for line in section.splitlines()) == \
        sum(r["system"] == "casync" for r in data["rows"])


def test_json_has_every_simulated_row(bench_run):
    _, _, data = bench_run
    sims = data["simulated"]
    cells = {(r["workers"], r["bandwidth_gbps"], r["strategy"], r["codec"]) for r in sims}
    expected = {(8, bw, s, c) for bw in (1.0, 10.0) for s in STRATEGIES for c in CODECS}
    expected |= {(8, bw, "auto", "auto") for bw in (1.0, 10.0)}
    assert cells == expected and len(sims) == len(expected)
    for r in sims:
        assert r["error"] is None and r["predicted_s"] > 0, r
    for s in ("ps-twoway",):  # a slower link never makes the same plan faster
        for c in CODECS:
            t = {r["bandwidth_gbps"]: r["predicted_s"] for r in sims if r["strategy"] == s and r["codec"] == c}
            assert t[1.0] >= t[10.0]


def test_markdown_table_lists_every_row(bench_run):
    _, out, data = bench_run
    text = (out / "bench.md").read_text()
    table = [line for line in text.splitlines() if line.startswith(("| casync |", "| torch", "| DDP + casync |"))]
    assert len(table) == len(data["rows"])
    assert "## DDP + casync hook against PyTorch's DDP hooks" in text
    assert "| tiny | 2 | DDP + casync hook ps-twoway / onebit |" in text
    for label in ("all_reduce 25 MiB buckets", "DDP fp16_compress_hook", "DDP powerSGD_hook r1"):
        assert label in text
    for strategy in STRATEGIES:
        assert sum(line.startswith(f"| casync | {strategy}") for line in table) == \
            len(CODECS) + (strategy == "auto")
    assert "## Simulated grid" in text and "N=8 1G" in text and "tiny" in text
    assert text.count(" *") >= 1  # the best casync configuration is marked


def test_the_summary_says_what_the_planner_chose_when_auto_is_fastest():
    """"auto / onebit" read as a onebit plan where the planner had sent every bucket uncompressed."""
    from casync.bench.report import summary_table
    from casync.bench.runner import BenchResult, Row

    rows = [Row("resnet50", 4, "baseline", "gloo-bucket", "none", sync_s=0.18),
            Row("resnet50", 4, "casync", "ring", "onebit", sync_s=0.15),
            Row("resnet50", 4, "casync", "auto", "onebit", sync_s=0.08,
                plan=[{"strategy": "ps", "codec": "none"}, {"strategy": "ps", "codec": "none"}])]
    result = BenchResult(setup=None, grid=None, rows=rows, sim_rows=[], machine={}, command="", seconds=0, iters=1,
                         warmup=0)
    _, body = summary_table(result)
    assert body[0][2] == "auto / onebit → ps/none" and body[0][5] == 2.25


def test_compute_threads_reach_every_engine_and_the_predictions(ray_local, tmp_path, monkeypatch):
    """``--compute-threads N``: each RayEngine of the measured rows and of the head to head runs N ops per actor
    at once, the rows are predicted with N compute lanes per actor, and the DDP hook's ranks run N too."""
    from casync.bench.hooks import casync_hook
    import casync.runtime.ray_engine as ray_engine

    seen = []

    class Recording(ray_engine.RayEngine):
        def __init__(self, *args, **kwargs):
            seen.append(kwargs.get("compute_threads", 1))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(ray_engine, "RayEngine", Recording)
    code = main(["bench", "--models", "tiny", "--workers", "2", "--strategies", "ring", "--codecs", "onebit",
                 "--baselines", "gloo-bucket", "--hooks", "ring/onebit", "--no-sim", "--iters", "1", "--warmup",
                 "0", "--head-to-head", "1", "--compute-threads", "2", "--out", str(tmp_path), "--no-progress",
                 "--no-calibrate"])
    assert code == 0
    assert seen == [2, 2]  # the grid's row, then the head to head's
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["grid"]["compute_threads"] == 2
    (row,) = [r for r in data["rows"] if r["system"] == "casync"]
    cluster = local_setup().cluster_model(2, compute_lanes=2)
    assert cluster.compute_lanes == 2
    plan = make_plan("tiny", 2, "ring", "onebit", ("onebit",), cluster)
    assert row["predicted_s"] == pytest.approx(simulate(plan, cluster).sync_time())
    one_lane = local_setup().cluster_model(2)
    assert row["predicted_s"] != pytest.approx(simulate(make_plan("tiny", 2, "ring", "onebit", ("onebit",), one_lane),
                                                        one_lane).sync_time())
    assert "compute_lanes=2" in (tmp_path / "bench.md").read_text()
    (hook,) = [r for r in data["rows"] if r["system"] == "hook"]
    assert hook["error"] is None and hook["consistent"] is True  # its ranks took --compute-threads 2
    assert casync_hook("ddp-casync:ring:onebit", 2)[0].compute_threads == 2


def test_an_auto_hook_row_plans_per_ddp_bucket_for_the_setups_cluster(tmp_path):
    """``--hooks auto/onebit``: the ranks get the setup's cluster model, the planner chooses per DDP bucket
    (none or onebit, a strategy, partitions), and the row shows and records what it chose."""
    code = main(["bench", "--models", "tiny", "--workers", "2", "--strategies", "", "--baselines", "ddp",
                 "--hooks", "auto/onebit", "--no-sim", "--iters", "1", "--warmup", "0", "--out", str(tmp_path),
                 "--no-progress", "--no-calibrate"])
    assert code == 0
    (auto,) = [r for r in json.loads((tmp_path / "bench.json").read_text())["rows"] if r["system"] == "hook"]
    assert auto["error"] is None and auto["consistent"] is True and auto["strategy"] == "ddp-casync:auto:onebit"
    assert auto["plan"] and all(p["strategy"] in ("ps", "ring", "allgather") and p["codec"] in ("none", "onebit")
                                for p in auto["plan"])
    assert auto["label"].startswith("DDP + casync hook auto / onebit → ")
    assert auto["label"] in (tmp_path / "bench.md").read_text()
    assert auto["predicted_s"] > 0  # its plan simulated from the first hook call (see the next test)


def test_a_hook_row_is_predicted_from_when_ddp_handed_its_buckets_over():
    """The simulator's span of the row's plan, each bucket ready when the last rank handed it over: a bucket
    handed over later moves the prediction; a row without its plan has none."""
    from casync.bench.runner import _hook_prediction

    plan = casync.build_plan("tiny", workers=2, strategy="ring", codec="onebit")
    cluster = local_setup().cluster_model(2)
    ready = {b.name: 0.001 * i for i, b in enumerate(plan.buckets)}
    entry = {"sim_plan": plan.to_dict(), "ready_s": ready}
    got = _hook_prediction(entry, cluster, None, print).iteration_time
    assert got == pytest.approx(simulate(plan, cluster, ready_times=ready).iteration_time)
    late = dict(ready, **{plan.buckets[-1].name: 0.5})
    assert _hook_prediction(dict(entry, ready_s=late), cluster, None, print).iteration_time > 0.5 > got
    assert _hook_prediction({"sim_plan": None, "ready_s": None}, cluster, None, print) is None
    said = []
    assert _hook_prediction(dict(entry, ready_s={"no such bucket": 0.1}), cluster, None, said.append) is None
    assert said and "predicting a hook row failed" in said[0]


def test_grid_rejects_bad_cells():
    with pytest.raises(ValueError, match="unknown strategy label"):
        Grid(strategies=("butterfly",))
    with pytest.raises(ValueError, match="unknown model"):
        Grid(models=("resnet51",))
    with pytest.raises(ValueError, match="only for strategy 'auto'"):
        plan_arguments("ring", "auto", ("none",))
    with pytest.raises(ValueError, match="unknown baseline"):
        Grid(baselines=("nccl",))
    with pytest.raises(ValueError, match="ints >= 2"):
        Grid(workers=(1,))
    with pytest.raises(ValueError, match="takes one codec"):
        Grid(hooks=("auto/auto",))
    with pytest.raises(ValueError, match="no '@transport'"):
        Grid(hooks=("ring@tcp/onebit",))
    with pytest.raises(ValueError, match="strategy/codec"):
        Grid(hooks=("ring",))
    with pytest.raises(ValueError, match="sevenbit"):
        Grid(hooks=("ring/sevenbit",))
    with pytest.raises(ValueError, match="objectstore"):
        Grid(transports=("direct", "objectstore"), compute_threads=2)
    for bw in (0.0, -10.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="bandwidths"):
            Grid(sim_bandwidths_gbps=(10.0, bw))
    assert Grid(strategies=("ring", "auto"), codecs=("none", "onebit")).hook_variants() == [
        "ddp-casync:ring:none", "ddp-casync:ring:onebit"]


def test_a_label_may_ask_for_partitions_in_every_row_that_builds_its_plan():
    """``ring.p8`` measures the ring with 8 partitions per bucket beside plain ``ring``: RayEngine's row, its
    prediction (the simulated grid's compact template too) and the DDP hook row all get 8."""
    from casync.bench.hooks import casync_hook, hook_arguments

    cluster = ClusterModel(nodes=4, workers_per_node=1, bandwidth_gbps=10.0)
    for label, parts in (("ring", 4), ("ring.p8", 8), ("ps-twoway.p8@tcp", 8), ("allgather.p2", 2)):
        built = make_plan("resnet50", 4, label, "onebit", ("onebit",), cluster)
        simulated = sim_plan("resnet50", 4, label.partition("@")[0], "onebit", ("onebit",), cluster)
        assert {len(b.partitions) for b in built.buckets} == {parts}
        assert {len(b.partitions) for b in simulated.buckets} == {parts}
    assert plan_arguments("ps-twoway.p16", "onebit", ()) == {"strategy": "ps", "two_way": True, "partitions": 16,
                                                              "codec": "onebit"}
    grid = Grid(models=("resnet50",), workers=(4,), strategies=("ring", "ring.p8"), codecs=("onebit",),
                hooks=("ring.p8/onebit",))
    assert [c[2] for c in grid.cells()] == ["ring", "ring.p8"]
    assert grid.hook_variants() == ["ddp-casync:ring.p8:onebit"]
    assert hook_arguments("ddp-casync:ring.p8:onebit") == {"strategy": "ring", "partitions": 8, "codec": "onebit"}
    assert casync_hook("ddp-casync:ring.p8:onebit")[0].options.partitions == 8


def test_auto_chooses_among_the_grids_fixed_strategies_and_codecs_from_the_model_alone():
    """An ``auto`` row's candidates are the strategies and codecs of the grid's fixed rows (issue #44): a grid of
    ring and allgather never gets a PS plan from ``auto``, whatever the model prefers; the planner's record says
    what it chose among, and no plan was run to choose (``build_plan`` plans from the simulator only)."""
    from casync.bench.labels import auto_strategies

    cluster = ClusterModel(nodes=4, workers_per_node=1, bandwidth_gbps=1.0)
    assert auto_strategies(("ring", "ps-twoway", "allgather", "auto")) == {"strategy": ["ring", "ps", "allgather"]}
    assert auto_strategies(("ps-oneway", "auto@tcp")) == {"strategy": ["ps"], "two_way": False}
    assert auto_strategies(("ps-oneway", "ps-twoway.p8", "ring@tcp")) == {"strategy": ["ps", "ring"]}
    assert auto_strategies(("auto",)) == {}  # no fixed row: the planner's own candidates
    # at 1 Gbit over 4 nodes the packaged model's best plan is PS (the simulated grid's column shows it)
    free = make_plan("resnet50", 4, "auto", "auto", ("none", "onebit"), cluster)
    assert "ps" in {b.strategy for b in free.buckets}
    plan = make_plan("resnet50", 4, "auto", "auto", ("none", "onebit"), cluster, strategies=("ring", "allgather", "auto"))
    assert {b.strategy for b in plan.buckets} <= {"ring", "allgather"}
    assert plan.options["planner"]["strategies"] == ["ring", "allgather"]
    assert plan.options["planner"]["codecs"] == ["none", "onebit"]
    simulated = sim_plan("resnet50", 4, "auto", "onebit", ("none", "onebit"), cluster, strategies=("ring", "auto"))
    assert {b.strategy for b in simulated.buckets} == {"ring"}
    assert plan_arguments("auto", "onebit", ("none", "onebit"), ("ring", "allgather")) == {
        "strategy": ["ring", "allgather"], "partitions": "auto", "codec": ["none", "onebit"]}
    # the DDP hook's auto row: among the run's fixed hook rows' strategies (the ranks read them off the row names)
    from casync.bench.hooks import casync_hook, hook_arguments

    assert hook_arguments("ddp-casync:auto:onebit", strategies=("ring", "auto")) == {
        "strategy": ["ring"], "partitions": "auto", "codec": ["none", "onebit"]}
    assert hook_arguments("ddp-casync:auto:onebit")["strategy"] == "auto"  # no fixed hook row: the planner's own
    state = casync_hook("ddp-casync:auto:onebit", cluster=cluster, strategies=("ring", "ps-oneway"))[0]
    assert state.options.strategy == ["ring", "ps"]


@pytest.mark.parametrize("label", ["ring.8", "ring.p0", "ring.p08", "ring.px", "ring.p8.p4", "auto.p8"])
def test_a_bad_partition_suffix_is_refused_naming_the_form(label):
    with pytest.raises(ValueError, match=r"'<label>\.p<count>'"):
        Grid(strategies=(label,))
    with pytest.raises(ValueError, match="fixed strategy"):
        Grid(hooks=(f"{label}/onebit",))


@pytest.mark.parametrize("args, needle", [
    (["--codecs", "sevenbit"], "sevenbit"),
    (["--strategies", "butterfly"], "butterfly"),
    (["--models", "resnet51"], "resnet51"),
    (["--iters", "0"], "--iters"),
    (["--compute-threads", "0"], "compute_threads"),
    (["--sim-bandwidths", "10,0"], "bandwidths"),  # was refused only after the measured grid had run
    (["--sim-bandwidths", "-1"], "bandwidths"),
    (["--models", ",", "--baselines", "none"], "nothing to run"),  # was: exit 0 having run nothing
    (["--strategies", "", "--baselines", "none", "--hooks", "none", "--no-sim"], "nothing to run"),
])
def test_bad_arguments_exit_with_a_message(args, needle, capsys):
    assert main(["bench", "--no-progress"] + args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("casync: error:") and needle in err[0]


def test_setups_describe_their_cluster(tmp_path):
    local = local_setup().cluster_model(4)
    assert (local.nodes, local.workers_per_node) == (1, 4)
    env = tmp_path / "links.env"
    env.write_text("nodes=4\nrate=1gbit\ndelay=\nhead=10.77.0.1\nmeasured_gbps=0.95\nlatency_us=11\n")
    setup = netem_setup(env)
    cluster = setup.cluster_model(4)
    assert (cluster.nodes, cluster.workers_per_node, cluster.bandwidth_gbps, cluster.latency_us) == (4, 1, 1.0, 11.0)
    assert setup.launcher().prefix(2) == ["ip", "netns", "exec", "csn3"]
    with pytest.raises(ValueError, match="one node each"):
        setup.cluster_model(5)
    assert parse_rate_gbps("500mbit") == 0.5 and math.isclose(parse_rate_gbps("10gbit"), 10.0)
    env.write_text("nodes=4\n")
    with pytest.raises(ValueError, match="missing rate"):
        netem_setup(env)


def test_an_unusable_out_fails_before_anything_runs(tmp_path, capsys):
    """--out naming a file was only refused when the report was written, after the whole grid had run."""
    import time

    taken = tmp_path / "a_file"
    taken.write_text("")
    started = time.monotonic()
    assert main(["bench", "--no-progress", "--models", "tiny", "--workers", "2", "--strategies", "ring",
                 "--codecs", "none", "--baselines", "none", "--hooks", "none", "--no-sim", "--out", str(taken)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("casync: error:") and "a_file" in err[0]
    assert time.monotonic() - started < 5
