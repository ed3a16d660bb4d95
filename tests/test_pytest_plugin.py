"""The pytest marker: a test that profiles steps passes against its own baseline and fails,
naming the step time, when its steps get slower."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

TEST_FILE = """
import os, time, pytest, torch
model = torch.nn.Linear(16, 16)

@pytest.mark.stepscope(steps=4, budget={"step_time": "+20%"}, baseline="perf/baseline")
def test_train_step_speed(stepscope_profile):
    for _ in range(stepscope_profile.total_steps):
        model(torch.randn(8, 16)).sum().backward()
        time.sleep(float(os.environ.get("EXTRA_SLEEP", "0.01")))
        stepscope_profile.step()
"""


def _plugin_args() -> list[str]:
    """``-p stepscope.pytest_plugin`` unless the installed package already registers the plugin
    through its ``pytest11`` entry point (registering it twice is an error)."""
    from importlib.metadata import entry_points

    installed = any(ep.value == "stepscope.pytest_plugin" for ep in entry_points(group="pytest11"))
    return ["-p", "no:cacheprovider"] + ([] if installed else ["-p", "stepscope.pytest_plugin"])


@pytest.mark.slow
def test_marker_saves_compares_and_fails_on_a_slower_step(pytester: pytest.Pytester,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    pytester.makepyfile(TEST_FILE)
    args = _plugin_args()
    pytester.runpytest_subprocess(*args, "--stepscope-save-baseline").assert_outcomes(passed=1)
    assert (pytester.path / "perf" / "baseline" / "step_times").is_dir()
    pytester.runpytest_subprocess(*args).assert_outcomes(passed=1)
    monkeypatch.setenv("EXTRA_SLEEP", "0.05")  # every step 40 ms slower: far over +20%
    result = pytester.runpytest_subprocess(*args)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*stepscope: regression*", "*step time*over +20%*"])
