"""pytest plugin (entry point ``pytest11``): profile a few training steps inside a test and fail
the test when they break a budget against a baseline, like pytest-memray's ``limit_memory``::

    @pytest.mark.stepscope(steps=5, budget={"step_time": "+5%"}, baseline="perf/baseline")
    def test_train_step_speed(stepscope_profile):
        for _ in range(stepscope_profile.total_steps):
            train_step()
            stepscope_profile.step()

- **Runs are named after their test**: the run name is the test's node id
  (``test_perf.py::test_train[128]``), reduced to a run id by the collector's own rule
  (:func:`stepscope.store.writer.run_id`: ``test_perf.py-test_train-128``). So one baseline
  folder serves every test, parametrised ones included: each test compares with its own run.
- ``baseline`` is a store folder, relative to the rootdir; ``DIR::NAME`` compares with baseline
  name ``NAME`` of that store (``baselines.json``) instead of the test's own run.
- ``pytest --stepscope-save-baseline`` stores each test's run in its baseline folder (replacing
  the previous one) instead of judging it; a test whose profile recorded nothing fails, and so
  does a session that saved no run at all.
- Without a baseline (no folder, or no run for this test) the test is skipped before its body
  runs, with the reason.
- ``budget`` replaces the default budgets (``step_time:+10%``, ``peak_memory:+10%``) and the
  project's ``stepscope.toml``; ``defaults=True`` keeps them and adds the marker's. ``floor``
  sets absolute floors per metric (``{"step_time": "1ms"}``), below which no change fails.

The candidate goes to a store under the test's ``tmp_path`` (``--stepscope-store DIR`` keeps it).
torch is imported only when a test asks for ``stepscope_profile``, so projects without torch can
run pytest with the plugin installed.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

SAVE_OPTION = "--stepscope-save-baseline"
_GATE = pytest.StashKey["_Gate"]()
_SAVED = pytest.StashKey[list[str]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("stepscope")
    group.addoption("--stepscope-store", default=None, help="store for the profiled runs (default: tmp_path)")
    group.addoption(SAVE_OPTION, action="store_true", default=False,
                    help="store each profiled run in its marker's baseline folder instead of judging it")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "stepscope(steps=5, warmup=1, budget=None, defaults=False, floor=None, "
                                       "baseline=None): profile `steps` training steps with the stepscope_profile "
                                       "fixture and fail on a budget against the test's run in the baseline store")
    config.stash[_SAVED] = []


@dataclass(frozen=True)
class _Baseline:
    """Where a test's baseline lives: the store folder and, with ``DIR::NAME``, a baseline name."""

    folder: Path
    name: str | None

    @classmethod
    def parse(cls, config: pytest.Config, spec: str) -> _Baseline:
        folder, sep, name = spec.partition("::")
        path = Path(folder)
        return cls(path if path.is_absolute() else Path(config.rootpath) / path, name if sep else None)

    def run_for(self, own_run: str) -> str | None:
        """The baseline run this test compares with, or None when there is none yet."""
        from stepscope.store.baselines import baseline_run
        from stepscope.store.runs import stored_runs

        if not (self.folder / "sources").is_dir():
            return None
        run = baseline_run(self.folder, self.name) if self.name else own_run
        return run if run in stored_runs(self.folder) else None


@dataclass
class _Gate:
    """What the fixture set up for one test: the running profile, where it writes, the settings."""

    profile: Any
    store: Path
    run: str
    baseline: _Baseline | None
    options: dict[str, Any]
    closed: bool = field(default=False)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.profile.__exit__(None, None, None)


def _options(request: pytest.FixtureRequest) -> dict[str, Any]:
    marker = request.node.get_closest_marker("stepscope")
    return dict(marker.kwargs) if marker else {}


@pytest.fixture
def stepscope_profile(request: pytest.FixtureRequest, tmp_path: Path) -> Generator[Any, None, None]:
    """A running ``stepscope.profile``; call ``.step()`` after each training step. Its
    ``total_steps`` is how many steps the marker's schedule needs (warm-up plus recorded)."""
    from stepscope.store.writer import run_id

    options = _options(request)
    run = run_id(request.node.nodeid)
    baseline = _Baseline.parse(request.config, options["baseline"]) if options.get("baseline") else None
    if baseline is not None and not request.config.getoption(SAVE_OPTION) and baseline.run_for(run) is None:
        what = f"baseline {baseline.name!r}" if baseline.name else f"baseline run {run!r}"
        pytest.skip(f"stepscope: no {what} in {baseline.folder} yet (record it with pytest {SAVE_OPTION})")

    import stepscope

    steps, warmup = int(options.get("steps", 5)), int(options.get("warmup", 1))
    root = request.config.getoption("--stepscope-store")
    store = Path(root) if root else tmp_path / "stepscope-store"
    # Converted on the writer thread: the trace is ready only after the last profiled step, so
    # no timed step shares the GIL with it, and a test saves a child process per trace.
    profile = stepscope.profile(store=store, run=run, wait=0, warmup=warmup, active=steps, convert="thread")
    profile.total_steps = warmup + steps
    gate = _Gate(profile, store, run, baseline, options)
    request.node.stash[_GATE] = gate
    profile.__enter__()
    try:
        yield profile
    finally:
        gate.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """After the test body: save its run as the baseline, or judge it against the baseline."""
    try:
        result = yield
    finally:
        gate = item.stash.get(_GATE, None)
        if gate is not None:
            gate.close()
    if gate is not None and gate.baseline is not None:
        if item.config.getoption(SAVE_OPTION):
            _save(item.config, gate)
        else:
            _judge(gate)
    return result


def _save(config: pytest.Config, gate: _Gate) -> None:
    from stepscope.store.baselines import set_baseline
    from stepscope.store.runs import copy_run

    assert gate.baseline is not None
    if not copy_run(gate.store, gate.baseline.folder, gate.run):
        pytest.fail(f"stepscope: {SAVE_OPTION} wrote nothing for run {gate.run!r}: the profile recorded no trace "
                    "(did the test call stepscope_profile.step() stepscope_profile.total_steps times?)",
                    pytrace=False)
    if gate.baseline.name:
        set_baseline(gate.baseline.folder, gate.baseline.name, gate.run, reason="pytest --stepscope-save-baseline")
    config.stash[_SAVED].append(gate.run)


def _judge(gate: _Gate) -> None:
    from stepscope.analysis.compare.budgets import budgets_from_mapping
    from stepscope.commands.compare import gate as compare_gate
    from stepscope.render.compare_text import render_text

    assert gate.baseline is not None
    budget = gate.options.get("budget")
    marker_budgets = budgets_from_mapping(budget, "@pytest.mark.stepscope(budget=...)") if budget else []
    floors = budgets_from_mapping(gate.options.get("floor") or {}, "@pytest.mark.stepscope(floor=...)")
    base_run = gate.baseline.run_for(gate.run)
    comparison, verdict = compare_gate(
        f"{gate.baseline.folder}::{base_run}", f"{gate.store}::{gate.run}", None, marker_budgets, None, None,
        floors=floors, defaults=bool(gate.options.get("defaults", not budget)))
    if verdict.status != "pass":
        pytest.fail(f"stepscope: {verdict.status}\n" + render_text(comparison, verdict), pytrace=False)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if config.getoption(SAVE_OPTION):
        saved = config.stash[_SAVED]
        if saved:
            terminalreporter.write_line(f"stepscope: saved {len(saved)} baseline run(s): {', '.join(saved)}")
        else:
            terminalreporter.write_line(f"stepscope: {SAVE_OPTION} saved no run: no test with "
                                        "@pytest.mark.stepscope(baseline=...) ran", red=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """``--stepscope-save-baseline`` that saved nothing fails the session: no test with
    ``@pytest.mark.stepscope(baseline=...)`` ran, so there is no baseline to judge against later."""
    if session.config.getoption(SAVE_OPTION) and not session.config.stash[_SAVED] and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
