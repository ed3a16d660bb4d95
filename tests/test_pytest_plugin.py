"""The pytest marker: tests sharing one baseline folder, parametrised ones included, each gate
on their own baseline runs; the save option writes three runs of every test and fails loudly when
it wrote nothing; without a baseline a test is skipped before its body runs; a marker's budget
replaces the defaults; a result in the grey zone re-runs the test, bounded; one still
inconclusive is skipped (failed on request)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

# Imported here, not inside a test: pytester drops the modules a test imported when it ends, and
# DuckDB's extension module cannot be loaded twice into one process (a later import aborts).
from stepscope.store.runs import stored_runs

pytest_plugins = ["pytester"]

# Not run alone: the one test that judges fresh timings gives its budgets room for any load the
# pass brings (TEST_FILE), and unchanged code may come out inconclusive, never a regression.

TEST_FILE = """
import os, pathlib, pytest, torch
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
data = torch.randn(20 * 256, 256)

def train(profile, name):
    with open("ran-" + name, "a") as ran:
        ran.write("body ran\\n")
    # a slow test trains on a batch twenty times as large: twenty times the work (CPU time, which
    # the gate judges, grows with work, not with sleeping) in the same ops (the same step structure)
    rows = 20 * 256 if name in os.environ.get("SLOW_TESTS", "").split(",") else 256
    for _ in range(profile.total_steps):
        model(data[:rows]).sum().backward()
        profile.step()

@pytest.mark.stepscope(steps=4, budget={"step_time": "+100%"}, baseline="perf/baseline")
def test_a(stepscope_profile):
    train(stepscope_profile, "a")

@pytest.mark.stepscope(steps=4, budget={"step_time": "+100%"}, defaults=True, baseline="perf/baseline")
def test_b(stepscope_profile):
    train(stepscope_profile, "b")

@pytest.mark.parametrize("width", [64, 128])
@pytest.mark.stepscope(steps=4, budget={"step_time": "+100%"}, baseline="perf/baseline")
def test_param(stepscope_profile, width):
    train(stepscope_profile, f"param{width}")
"""
"""Four tests, two sharing a marker; budgets wide enough (+100% against a 20x slowdown) that no
machine load decides the outcome of a slow test: the gate allows load to inflate either side's
CPU time by up to 1.9x (stats.LOAD_INFLATION; 2.2x past the load ceiling), so a slowdown must
measure over 3.8x (4.4x past the ceiling) to be a regression on a loaded machine, and 20x the
work measures well over that (~15x quiet, ~8x with the baseline inflated 1.9x and the candidate
not)."""

TESTS = ["test_gate.py-test_a", "test_gate.py-test_b", "test_gate.py-test_param-128", "test_gate.py-test_param-64"]
"""The run ids of the four tests: node ids reduced by the collector's run-name rule."""
RUNS = sorted(f"{t}{suffix}" for t in TESTS for suffix in ("", "..run2", "..run3"))
"""What the save option stores: three runs of each test."""



def _need_torch() -> None:
    """Skip without torch. Not ``importorskip``: pytester restores ``sys.modules`` after each test,
    and torch cannot be imported twice into one process; the inner pytest imports it."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")


def _plugin_args() -> list[str]:
    """``-p stepscope.pytest_plugin`` unless the installed package already registers the plugin
    through its ``pytest11`` entry point (registering it twice is an error)."""
    from importlib.metadata import entry_points

    installed = any(ep.value == "stepscope.pytest_plugin" for ep in entry_points(group="pytest11"))
    return ["-p", "no:cacheprovider"] + ([] if installed else ["-p", "stepscope.pytest_plugin"])


@pytest.mark.slow
def test_shared_baseline_folder_and_parametrised_tests(pytester: pytest.Pytester,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _need_torch()

    pytester.makepyfile(test_gate=TEST_FILE)
    args = _plugin_args()
    saved = pytester.runpytest_subprocess(*args, "--stepscope-save-baseline")
    saved.assert_outcomes(passed=4)
    saved.stdout.fnmatch_lines(["*stepscope: saved 4 baseline run(s)*"])
    assert stored_runs(pytester.path / "perf" / "baseline") == RUNS
    records = json.loads((pytester.path / "perf" / "baseline" / "baselines.json").read_text())["baselines"]
    assert {name: entry["runs"] for name, entry in records.items()} == {
        t: [t, f"{t}..run2", f"{t}..run3"] for t in TESTS}
    assert (pytester.path / "ran-a").read_text().count("body ran") == 3
    # each against its own runs (no re-run: the re-run loop has its own test): unchanged code is
    # never a regression; on a loaded machine the gate may not be able to rule one out, and the
    # test is then skipped as inconclusive, the honest answer, never passed
    same = pytester.runpytest_subprocess(*args, "--stepscope-reruns", "0", "-rs")
    unchanged = same.parseoutcomes()
    assert unchanged.get("passed", 0) + unchanged.get("skipped", 0) == 4, same.stdout.str()
    assert "stepscope: regression" not in same.stdout.str()
    if unchanged.get("skipped"):  # the grey zone, or past the load ceiling (docs/ci.md)
        same.stdout.fnmatch_lines(["SKIPPED*stepscope: inconclusive: step time * the change between *"])
        assert re.search(r"\((grey_zone|too_loaded)", same.stdout.str()), same.stdout.str()

    monkeypatch.setenv("SLOW_TESTS", "b,param128")  # two tests do 20x the work per step
    result = pytester.runpytest_subprocess(*args, "--stepscope-reruns", "0")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 2 and outcomes.get("passed", 0) + outcomes["failed"] == 4, outcomes
    result.stdout.fnmatch_lines(["*FAILED test_gate.py::test_b - Failed: stepscope: regression*",
                                 "*FAILED test_gate.py::test_param?128? - Failed: stepscope: regression*"])
    result.stdout.fnmatch_lines(["*stepscope: regression*", "*step time*over +100% by more than the noise*"])
    report = result.stdout.str()
    assert "test_a - Failed: stepscope: regression" not in report  # unchanged: never a regression
    assert "test_param[64] - Failed: stepscope: regression" not in report
    of_b = report.split("_ test_b _")[1].split("_ test_param[128] _")[0]
    # up to pytest's short summary, which repeats every failure whole when $CI is set
    of_param = report.split("_ test_param[128] _")[1].split("short test summary info")[0]
    assert "step_time:+100%" in of_param and "peak_memory:+10%" not in of_param  # the marker's budget only
    assert "step_time:+100%" in of_b and "peak_memory:+10%" in of_b  # defaults=True keeps the defaults


GREY_CONFTEST = '''
import dataclasses, os
import stepscope.analysis.compare.gate as gate

judged = gate.evaluate_budget

def grey_until(comparison, budget, floor):
    """Every budget in the grey zone until the candidate has GREY_UNTIL runs, then within
    budget (with FAIL set: over budget on every run): the plugin's re-run loop, without
    depending on how busy this machine is."""
    result = judged(comparison, budget, floor)
    with open("judged-with", "a") as log:
        log.write(f"{len(comparison.candidate_runs)}\\n")
    if os.environ.get("FAIL"):
        return dataclasses.replace(result, status="fail", decided_by="noise")
    if len(comparison.candidate_runs) < int(os.environ["GREY_UNTIL"]):
        return dataclasses.replace(result, status="inconclusive", decided_by="grey_zone")
    return dataclasses.replace(result, status="pass", decided_by="threshold")

gate.evaluate_budget = grey_until
'''

ONE_TEST = TEST_FILE.split("@pytest.mark.stepscope")[0] + '''
@pytest.mark.stepscope(steps=4, baseline_runs=1, budget={"step_time": "+100%"}, baseline="perf/baseline")
def test_a(stepscope_profile):
    train(stepscope_profile, "a")
'''


def _stepscope_property(junit: Path) -> dict[str, Any]:
    """The one test case's ``stepscope`` property in a ``--junitxml`` file, parsed."""
    import xml.etree.ElementTree as ET

    (prop,) = [p for p in ET.parse(junit).getroot().iter("property") if p.get("name") == "stepscope"]
    return json.loads(prop.get("value") or "")


@pytest.mark.slow
def test_a_grey_result_reruns_the_test_bounded(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    _need_torch()
    pytester.makepyfile(test_gate=ONE_TEST)
    args = _plugin_args()
    pytester.runpytest_subprocess(*args, "--stepscope-save-baseline").assert_outcomes(passed=1)
    assert (pytester.path / "ran-a").read_text().count("body ran") == 1  # baseline_runs=1
    pytester.makeconftest(GREY_CONFTEST)
    monkeypatch.setenv("GREY_UNTIL", "3")
    pytester.runpytest_subprocess(*args, "--junitxml=judged.xml").assert_outcomes(passed=1)
    assert sorted(set((pytester.path / "judged-with").read_text().split())) == ["1", "2", "3"]
    verdict = _stepscope_property(pytester.path / "judged.xml")  # a pass carries its verdict too
    assert verdict["status"] == "pass" and verdict["runs"] == 3 and verdict["budgets"]
    assert (pytester.path / "ran-a").read_text().count("body ran") == 1 + 3  # the body ran thrice
    monkeypatch.setenv("GREY_UNTIL", "99")  # never decided: skipped, its verdict still recorded
    result = pytester.runpytest_subprocess(*args, "--stepscope-reruns", "0", "-rs", "--junitxml=grey.xml")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*: stepscope: inconclusive: step time * the change between * and *"
                                 "(grey_zone*; load average *"])
    verdict = _stepscope_property(pytester.path / "grey.xml")
    assert verdict["status"] == "inconclusive" and verdict["runs"] == 1
    # failed on request, after its reruns (bounded): the option, then the ini file
    result = pytester.runpytest_subprocess(*args, "--stepscope-reruns", "1", "--stepscope-inconclusive", "fail")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*stepscope: inconclusive after 2 runs*"])
    assert (pytester.path / "ran-a").read_text().count("body ran") == 1 + 3 + 1 + 2
    pytester.makeini("[pytest]\nstepscope_inconclusive = fail\n")
    pytester.runpytest_subprocess(*args, "--stepscope-reruns", "0").assert_outcomes(failed=1)
    pytester.runpytest_subprocess(*args, "--stepscope-reruns", "0", "--stepscope-inconclusive",
                                  "skip").assert_outcomes(skipped=1)  # the command line wins
    (pytester.path / "tox.ini").unlink()  # what makeini wrote
    # a regression on the first run is re-run too, and fails only on all three runs
    (pytester.path / "judged-with").unlink()
    monkeypatch.setenv("FAIL", "1")
    result = pytester.runpytest_subprocess(*args)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*stepscope: regression after 3 runs*"])
    assert sorted(set((pytester.path / "judged-with").read_text().split())) == ["1", "2", "3"]
    assert (pytester.path / "ran-a").read_text().count("body ran") == 1 + 3 + 1 + 2 + 1 + 1 + 3



@pytest.mark.slow
def test_without_a_baseline_tests_skip_before_their_body(pytester: pytest.Pytester) -> None:
    _need_torch()
    pytester.makepyfile(test_gate=TEST_FILE)
    result = pytester.runpytest_subprocess(*_plugin_args(), "-rs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped") == 4 and "warnings" not in outcomes and "passed" not in outcomes
    result.stdout.fnmatch_lines(["*stepscope: no baseline run 'test_gate.py-test_a' in *perf/baseline yet "
                                 "(record it with pytest --stepscope-save-baseline)*"])
    assert not list(pytester.path.glob("ran-*"))  # no body ran


@pytest.mark.slow
def test_saving_nothing_fails_loudly(pytester: pytest.Pytester) -> None:
    _need_torch()
    pytester.makepyfile(test_idle="""
import pytest

@pytest.mark.stepscope(steps=4, baseline="perf/baseline")
def test_never_steps(stepscope_profile):
    pass
""")
    result = pytester.runpytest_subprocess(*_plugin_args(), "--stepscope-save-baseline")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*--stepscope-save-baseline wrote nothing for run 'test_idle.py-test_never_steps'*",
                                 "*stepscope: --stepscope-save-baseline saved no run*"])
    assert result.ret != 0
