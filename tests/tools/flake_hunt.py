"""Hunt flaky tests: run every test that starts a thread or a process many times, quiet and beside CPU burners.

    python -m tests.tools.flake_hunt --runs 20 [--burners 2] [--out hunt.json] [paths ...]
    python -m tests.tools.flake_hunt --merge a.json b.json --out all.json --markdown all.md

Both phases run in this process (``-p no:xdist``: the plugins below must see every test, which xdist's workers
would hide).
Phase 1 runs the given test paths once (default: tests/torch, tests/runtime, tests/transport, tests/engines)
and records which tests started a thread, a process (multiprocessing, subprocess) or used Ray: the tests that
can race.  Phase 2 runs each of those ``--runs`` times in one pytest session (the repeats of a test run one after
another, so module fixtures such as the shared Ray are made once), optionally beside ``--burners`` processes
that spin on a core each (a loaded machine: threads get descheduled mid-step).  Writes a JSON of runs and
failures per test, with the first failure's text, the commit and the load average it ran under, and prints a
table of the tests that failed.  ``--merge`` adds up hunts made in pieces (a 20-run hunt of ~290 tests takes hours
on 2 cores).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

DEFAULT_PATHS = ["tests/torch", "tests/runtime", "tests/transport", "tests/engines"]


class Classify:
    """pytest plugin: the tests during which a thread or a process started, or that use Ray."""

    def __init__(self) -> None:
        self.concurrent: list[str] = []
        self._started = 0
        self._patch()

    def _patch(self) -> None:
        plugin = self

        def counted(original: Any) -> Any:
            def start(*args: Any, **kwargs: Any) -> Any:
                plugin._started += 1
                return original(*args, **kwargs)
            return start

        threading.Thread.start = counted(threading.Thread.start)  # type: ignore[method-assign]
        multiprocessing.process.BaseProcess.start = counted(multiprocessing.process.BaseProcess.start)
        subprocess.Popen.__init__ = counted(subprocess.Popen.__init__)  # type: ignore[method-assign]

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Any) -> Any:
        before = self._started
        yield
        uses_ray = "ray_local" in getattr(item, "fixturenames", ()) or item.get_closest_marker("ray") is not None \
            or item.get_closest_marker("cluster") is not None
        if self._started > before or uses_ray:
            self.concurrent.append(item.nodeid)


def base_id(nodeid: str) -> str:
    """A repeated test's id without its repeat index (``test_a[8-hunt3]`` -> ``test_a[8]``)."""
    if not nodeid.endswith("]") or "[" not in nodeid:
        return nodeid
    head, params = nodeid[:-1].split("[", 1)
    rest = re.sub(r"(^|-)hunt\d+(?=-|$)", "", params).strip("-")
    return f"{head}[{rest}]" if rest else head


class Repeat:
    """pytest plugin: each of ``tests`` ``count`` times in a row (the other tests of their modules deselected);
    records every outcome per test."""

    def __init__(self, tests: list[str], count: int) -> None:
        self.wanted = set(tests)
        self.count = count
        self.results: dict[str, dict[str, Any]] = {}

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        metafunc.fixturenames.append("_hunt_run")
        metafunc.parametrize("_hunt_run", range(self.count), ids=lambda i: f"hunt{i}")

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        keep = [item for item in items if base_id(item.nodeid) in self.wanted]
        config.hook.pytest_deselected(items=[item for item in items if base_id(item.nodeid) not in self.wanted])
        items[:] = keep

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped or (report.when != "call" and not report.failed):
            return  # a skipped run is no run: a test skipped every time shows as not repeated
        entry = self.results.setdefault(base_id(report.nodeid), {"runs": 0, "failures": 0, "seconds": 0.0,
                                                                 "first_failure": None})
        if report.when == "call":
            entry["runs"] += 1
            entry["seconds"] = round(entry["seconds"] + report.duration, 3)
        if report.failed:
            entry["failures"] += 1
            if entry["first_failure"] is None:
                entry["first_failure"] = f"{report.when}: " + str(report.longrepr)[-1500:]


def burn() -> None:
    while True:
        pass


class LoadSampler:
    """The 1-minute load average every ``every_s`` seconds while the hunt runs: how loaded "loaded" was."""

    def __init__(self, every_s: float = 10.0) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)

    def _run(self, every_s: float) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(every_s)

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float]:
        values = self.samples or [os.getloadavg()[0]]
        return {"min": round(min(values), 2), "mean": round(sum(values) / len(values), 2), "max": round(max(values), 2)}


def merge(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Several hunts of the same kind (e.g. one per session) as one: runs, failures and seconds summed per test,
    the first failure's text kept; ``parts`` says what each hunt was."""
    tests: dict[str, dict[str, Any]] = {}
    for report in reports:
        for test, r in report["tests"].items():
            entry = tests.setdefault(test, {"runs": 0, "failures": 0, "seconds": 0.0, "first_failure": None})
            entry["runs"] += r["runs"]
            entry["failures"] += r["failures"]
            entry["seconds"] = round(entry["seconds"] + r["seconds"], 3)
            entry["first_failure"] = entry["first_failure"] or r["first_failure"]
    parts = [{k: report.get(k) for k in ("runs", "burners", "cores", "seconds", "commit", "load", "pytest_exit")}
             for report in reports]
    not_repeated = sorted(set().union(*(report.get("not_repeated", []) for report in reports)) - set(tests))
    return {"runs": sum(p["runs"] for p in parts), "burners": sorted({p["burners"] for p in parts}),
            "cores": reports[0]["cores"], "seconds": round(sum(p["seconds"] for p in parts), 1), "parts": parts,
            "tests": tests, "not_repeated": not_repeated}


def _commit() -> str | None:
    run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return run.stdout.strip() or None if run.returncode == 0 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", default=DEFAULT_PATHS)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--burners", type=int, default=0, help="processes spinning on a core each during phase 2")
    parser.add_argument("--tests", help="a file of test ids (one per line) to hunt instead of classifying paths")
    parser.add_argument("--out", default="flake_hunt.json")
    parser.add_argument("--markdown", help="also write the table of every hunted test (runs, failures) here")
    parser.add_argument("--merge", nargs="+", metavar="JSON",
                        help="hunt nothing: add up these reports (e.g. one per session) into --out and --markdown")
    args = parser.parse_args(argv)
    if args.merge:
        report = merge([json.loads(Path(path).read_text()) for path in args.merge])
        Path(args.out).write_text(json.dumps(report, indent=1))
        if args.markdown:
            Path(args.markdown).write_text(markdown(report))
        failed = sum(1 for r in report["tests"].values() if r["failures"])
        print(f"flake_hunt: {len(args.merge)} reports, {len(report['tests'])} tests, {failed} failed at least once; "
              f"{args.out}")
        return 0 if not failed else 1
    if args.runs < 1 or args.burners < 0:
        parser.error("--runs must be >= 1 and --burners >= 0")
    started = time.time()
    if args.tests:
        tests = [t.strip() for t in Path(args.tests).read_text().splitlines() if t.strip()]
    else:
        classify = Classify()
        pytest.main(["-q", "-p", "no:xdist", "-p", "no:cacheprovider", *args.paths], plugins=[classify])
        tests = classify.concurrent
        listed = Path(args.out).with_suffix(".tests.txt")
        listed.write_text("".join(f"{test}\n" for test in tests))  # phase 1's list: --tests repeats it
        print(f"flake_hunt: {len(tests)} tests start a thread or a process, or use Ray (listed in {listed})",
              flush=True)
    burners = [multiprocessing.Process(target=burn, daemon=True) for _ in range(args.burners)]
    for proc in burners:
        proc.start()
    repeat = Repeat(tests, args.runs)
    try:
        with LoadSampler() as load:
            code = _hunt(tests, repeat)
    finally:
        for proc in burners:
            proc.kill()
    not_repeated = sorted(set(tests) - set(repeat.results))  # skipped each time (e.g. needs CUDA), or not collected
    report = {"runs": args.runs, "burners": args.burners, "cores": os.cpu_count(), "paths": args.paths,
              "seconds": round(time.time() - started, 1), "commit": _commit(), "load": load.summary(),
              "pytest_exit": code, "tests": repeat.results,
              "not_repeated": not_repeated}
    Path(args.out).write_text(json.dumps(report, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(markdown(report))
    failed = {t: r for t, r in repeat.results.items() if r["failures"]}
    print(f"flake_hunt: {len(repeat.results)} tests x {args.runs} runs, {args.burners} burner(s): "
          f"{len(failed)} failed at least once; {args.out}")
    for test, r in sorted(failed.items()):
        print(f"  {r['failures']}/{r['runs']}  {test}")
    for test in not_repeated:
        print(f"  not repeated (skipped or not collected): {test}")
    return 0 if not failed else 1


def markdown(report: dict[str, Any]) -> str:
    """The hunt as a table: every test, its runs and failures, failing tests first."""
    rows = sorted(report["tests"].items(), key=lambda kv: (-kv[1]["failures"], kv[0]))
    lines = [f"{len(rows)} tests x {report['runs']} runs, {report['burners']} CPU burner(s), {report['cores']} cores, "
             f"{report['seconds']:.0f} s"]
    for part in report.get("parts", [report]):
        load = part.get("load") or {}
        lines.append(f"- {part['runs']} runs at `{part.get('commit')}`, {part['burners']} burner(s), "
                     f"{part['seconds']:.0f} s, 1-minute load {load.get('min')}-{load.get('max')} "
                     f"(mean {load.get('mean')})")
    lines += ["", "| test | runs | failures | seconds (all runs) |", "|---|---:|---:|---:|"]
    lines += [f"| `{test}` | {r['runs']} | {r['failures']} | {r['seconds']:.1f} |" for test, r in rows]
    if report.get("not_repeated"):
        lines += ["", "Not repeated (skipped every time, e.g. needing CUDA, or not collected):", ""]
        lines += [f"- `{test}`" for test in report["not_repeated"]]
    return "\n".join(lines) + "\n"


def _hunt(tests: list[str], repeat: Repeat) -> int:
    """Run ``tests`` under the Repeat plugin; pytest's exit code."""
    if not tests:
        return 5
    modules = sorted({test.split("::", 1)[0] for test in tests})
    return int(pytest.main(["-q", "-p", "no:xdist", "-p", "no:cacheprovider", *modules], plugins=[repeat]))


if __name__ == "__main__":
    sys.exit(main())
