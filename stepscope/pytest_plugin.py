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
- ``pytest --stepscope-save-baseline`` runs each test ``baseline_runs`` times (default 3) and
  stores the runs in its baseline folder (replacing the previous ones; ``baselines.json`` names
  them after the test's run) instead of judging: the spread between them is the run-to-run noise a
  change must exceed. A test whose profile recorded nothing fails, and so does a session that
  saved no run at all.
- Every judged test carries its verdict in ``user_properties`` (``stepscope``: JSON with the
  status, the runs judged and each budget's message), so a pass says how close it was too
  (``--junitxml`` writes it).
- When a judged change is in the grey zone (within the noise of its budget), the test body runs
  again, up to ``reruns`` more times (default 2, ``--stepscope-reruns``), and the candidate's runs
  are judged together, as benchmark harnesses re-run a close result. Still inconclusive, the test
  is **skipped**, its reason one line starting ``stepscope: inconclusive`` (the bounds, the
  load): visible, never a pass, and not a red CI on a busy runner for code that did not change
  (bench_gate.py's plugin part: unchanged code was inconclusive in 16-20 of 20 tests there);
  ``inconclusive="fail"`` in the marker, ``--stepscope-inconclusive fail`` or the ini option
  ``stepscope_inconclusive = fail`` fails it instead. A regression is re-run the same way before
  the test fails: it stands only on all ``1 + reruns`` runs (:func:`_judge` says why).
- While the body runs torch is pinned to ``threads`` intra-op threads (default 1, restored
  afterwards): a pool sized to a shared machine's cores makes CPU step times swing more than any
  budget (docs/ci.md).
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

import json
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from stepscope.analysis.compare import Comparison, Verdict

SAVE_OPTION = "--stepscope-save-baseline"
RERUNS_OPTION = "--stepscope-reruns"
BASELINE_RUNS_OPTION = "--stepscope-baseline-runs"
INCONCLUSIVE_OPTION = "--stepscope-inconclusive"
INCONCLUSIVE_INI = "stepscope_inconclusive"
INCONCLUSIVE_CHOICES = ("skip", "fail")
"""What a test still inconclusive after its re-runs becomes: skipped (the default) or failed."""
DEFAULT_RERUNS = 2
"""Extra runs of a test whose result is in the grey zone: with the first, three candidate runs,
as many as a baseline keeps."""
_GATE = pytest.StashKey["_Gate"]()
_SAVED = pytest.StashKey[list[str]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("stepscope")
    group.addoption("--stepscope-store", default=None, help="store for the profiled runs (default: tmp_path)")
    group.addoption(SAVE_OPTION, action="store_true", default=False,
                    help="store each profiled test's runs in its marker's baseline folder instead of judging them")
    group.addoption(RERUNS_OPTION, type=int, default=None, metavar="N",
                    help=f"re-run a test whose result is in the grey zone up to N times (default {DEFAULT_RERUNS}; "
                         "the marker's reruns= wins)")
    group.addoption(BASELINE_RUNS_OPTION, type=int, default=None, metavar="N",
                    help="runs of each test that --stepscope-save-baseline stores (default 3; the marker's "
                         "baseline_runs= wins)")
    group.addoption(INCONCLUSIVE_OPTION, choices=INCONCLUSIVE_CHOICES, default=None,
                    help="a test still inconclusive after its re-runs is skipped (default) or fails (the "
                         f"marker's inconclusive= wins, then this, then the ini option {INCONCLUSIVE_INI})")
    parser.addini(INCONCLUSIVE_INI, "skip or fail a test still inconclusive after its re-runs (default skip)",
                  default="skip")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "stepscope(steps=5, warmup=1, budget=None, defaults=False, floor=None, "
                                       "baseline=None, reruns=2, baseline_runs=3, threads=1, inconclusive='skip'): "
                                       "profile `steps` training steps with the stepscope_profile fixture and fail "
                                       "on a budget against the test's runs in the baseline store")
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
        """The (newest) baseline run this test compares with, or None when there is none yet."""
        from stepscope.store.baselines import baseline_run
        from stepscope.store.runs import stored_runs

        if not (self.folder / "sources").is_dir():
            return None
        run = baseline_run(self.folder, self.name) if self.name else own_run
        return run if run in stored_runs(self.folder) else None

    def spec(self, own_run: str) -> str:
        """What ``compare`` reads as every run of this test's baseline: ``DIR::NAME``, where
        NAME is the marker's baseline name or the test's run (its entry in ``baselines.json``
        lists the saved runs; a folder saved before that holds the run alone)."""
        return f"{self.folder}::{self.name or own_run}"


@dataclass
class _Gate:
    """What the fixture set up for one test: the running profile, where it writes, the settings."""

    profile: Any
    store: Path
    run: str
    baseline: _Baseline | None
    options: dict[str, Any]
    closed: bool = field(default=False)
    runs: list[str] = field(default_factory=list)
    """Every run of this test so far: the first, then each repeat."""

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.profile.__exit__(None, None, None)

    def start(self, run: str) -> Any:
        """A fresh profile of run ``run`` (the marker's schedule), entered; it becomes current."""
        import stepscope

        steps, warmup = int(self.options.get("steps", 5)), int(self.options.get("warmup", 1))
        # Converted on the writer thread: the trace is ready only after the last profiled step, so
        # no timed step shares the GIL with it, and a test saves a child process per trace.
        profile = stepscope.profile(store=self.store, run=run, wait=0, warmup=warmup, active=steps, convert="thread")
        profile.total_steps = warmup + steps
        self.profile, self.closed = profile, False
        self.runs.append(run)
        profile.__enter__()
        return profile


class _Pinned:
    """torch's intra-op threads set to ``threads`` while a test body runs, then restored."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.before: int | None = None

    def __enter__(self) -> None:
        import torch

        self.before = torch.get_num_threads()
        torch.set_num_threads(self.threads)

    def __exit__(self, *exc: object) -> None:
        import torch

        if self.before is not None:
            torch.set_num_threads(self.before)


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

    root = request.config.getoption("--stepscope-store")
    store = Path(root) if root else tmp_path / "stepscope-store"
    gate = _Gate(None, store, run, baseline, options, closed=True)
    request.node.stash[_GATE] = gate
    with _Pinned(int(options.get("threads", 1))):
        profile = gate.start(run)
        try:
            yield profile
        finally:
            gate.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """After the test body: save its runs as the baseline, or judge it against the baseline."""
    try:
        result = yield
    finally:
        gate = item.stash.get(_GATE, None)
        if gate is not None:
            gate.close()
    if gate is not None and gate.baseline is not None:
        if item.config.getoption(SAVE_OPTION):
            _save(item, gate)
        else:
            _judge(item, gate)
    return result


def _setting(item: pytest.Item, gate: _Gate, key: str, option: str, default: int) -> int:
    """The marker's ``key``, else the command line's ``option``, else ``default``."""
    value = gate.options.get(key)
    if value is None:
        value = item.config.getoption(option)
    return int(default if value is None else value)


def _repeat(item: pytest.Item, gate: _Gate) -> str:
    """Run the test body once more, into a run of its own (``<run>..run<N>``); returns its name.
    The test's other fixtures are the first run's: as a benchmark harness repeats the timed code."""
    run = f"{gate.run}..run{len(gate.runs) + 1}"
    assert isinstance(item, pytest.Function)
    with _Pinned(int(gate.options.get("threads", 1))):
        item.funcargs["stepscope_profile"] = gate.start(run)
        try:
            item.runtest()
        finally:
            gate.close()
    return run


def _save(item: pytest.Item, gate: _Gate) -> None:
    from stepscope.store.baselines import DEFAULT_KEEP, set_baseline
    from stepscope.store.runs import copy_run

    assert gate.baseline is not None
    count = max(1, _setting(item, gate, "baseline_runs", BASELINE_RUNS_OPTION, DEFAULT_KEEP))
    while len(gate.runs) < count:
        _repeat(item, gate)
    for run in gate.runs:
        if not copy_run(gate.store, gate.baseline.folder, run):
            pytest.fail(f"stepscope: {SAVE_OPTION} wrote nothing for run {run!r}: the profile recorded no trace "
                        "(did the test call stepscope_profile.step() stepscope_profile.total_steps times?)",
                        pytrace=False)
    name = gate.baseline.name or gate.run
    for index, run in enumerate(gate.runs):
        set_baseline(gate.baseline.folder, name, run, reason=f"pytest {SAVE_OPTION}", keep=count, append=index > 0)
    item.config.stash[_SAVED].append(gate.run)


def needs_another_run(comparison: Comparison, verdict: Verdict) -> bool:
    """Whether the plugin runs a judged test's body again (:func:`_judge` says why): a comparable
    result in the grey zone, or a regression. Shared with ``bench_gate.py --rejudge``, which must
    replay the plugin's judgement on its kept runs, not a rule of its own."""
    grey = verdict.status == "inconclusive" and comparison.comparable and any(r.grey for r in verdict.results)
    return grey or verdict.status == "regression"


def _judge(item: pytest.Item, gate: _Gate) -> None:
    """Judge the test's runs against its baseline; while the result is grey or a regression,
    run the body again (``reruns`` times at most) and judge all its runs together.

    Why a regression is re-run too: on a shared machine one run's CPU time can be inflated past
    what the gate allows for load, and a run whose steps were never preempted is allowed nothing
    (:func:`stepscope.analysis.compare.stats.preemption`). In ``bench_gate.py``'s plugin part at a
    load average of 6-13 (other jobs), unchanged tests measured 2.3-2.5x their baseline in one or
    two runs, and 4 of 20 failed as regressions on those runs alone; judged on three consecutive
    runs of the same recordings (the median of three), none of 43 did (docs/ci.md)."""
    from stepscope.analysis.compare.budgets import budgets_from_mapping
    from stepscope.commands.compare import gate as compare_gate
    from stepscope.render.compare_text import render_text

    assert gate.baseline is not None
    budget = gate.options.get("budget")
    marker_budgets = budgets_from_mapping(budget, "@pytest.mark.stepscope(budget=...)") if budget else []
    floors = budgets_from_mapping(gate.options.get("floor") or {}, "@pytest.mark.stepscope(floor=...)")
    reruns = max(0, _setting(item, gate, "reruns", RERUNS_OPTION, DEFAULT_RERUNS))
    while True:
        comparison, verdict = compare_gate(
            gate.baseline.spec(gate.run), [f"{gate.store}::{run}" for run in gate.runs], None, marker_budgets, None,
            None, floors=floors, defaults=bool(gate.options.get("defaults", not budget)))
        if not needs_another_run(comparison, verdict) or len(gate.runs) > reruns:
            break
        _repeat(item, gate)
    item.user_properties.append(("stepscope", json.dumps(
        {"status": verdict.status, "runs": len(gate.runs),
         "budgets": [r.message for r in verdict.results if r.status != "not_available"]})))
    if verdict.status == "pass":
        return
    again = f" after {len(gate.runs)} runs" if len(gate.runs) > 1 else ""
    if verdict.status == "inconclusive" and _inconclusive(item, gate) == "skip":
        pytest.skip(f"stepscope: inconclusive{again}: {_why_inconclusive(verdict)}")
    pytest.fail(f"stepscope: {verdict.status}{again}\n" + render_text(comparison, verdict), pytrace=False)


def _inconclusive(item: pytest.Item, gate: _Gate) -> str:
    """What a test still inconclusive becomes: the marker's ``inconclusive``, else the command
    line's, else the ini option's (``skip`` or ``fail``)."""
    value = gate.options.get("inconclusive") or item.config.getoption(INCONCLUSIVE_OPTION) \
        or item.config.getini(INCONCLUSIVE_INI)
    if value not in INCONCLUSIVE_CHOICES:
        pytest.fail(f"stepscope: inconclusive={value!r}: expected one of {', '.join(INCONCLUSIVE_CHOICES)}",
                    pytrace=False)
    return str(value)


def _why_inconclusive(verdict: Verdict) -> str:
    """One line: each grey budget's change and bounds, and how loaded the runs were (or the first
    reason, for runs that cannot be compared)."""
    from stepscope.units import format_value, signed_percent

    parts = []
    for r in verdict.results:
        if not r.grey or r.bounds is None:
            continue
        m = r.metric
        base = abs(m.base_value or 0.0)
        low, high = ((signed_percent(100 * b / base) for b in r.bounds) if base
                     else (format_value(b, m.unit) for b in r.bounds))
        load = m.noise.load if m.noise is not None else None
        loaded = "" if load is None else f"; runs' wall/CPU up to {load.worst:.2f}x"
        parts.append(f"{m.label} {format_value(m.base_value, m.unit)} -> {format_value(m.cand_value, m.unit)}, "
                     f"the change between {low} and {high} ({r.decided_by}{loaded})")
    if not parts:
        parts = [verdict.reasons[0].splitlines()[0] if verdict.reasons else "no reason given"]
    return "; ".join(parts) + f"; load average {_load_average()}"


def _load_average() -> str:
    """The 1-minute load average, or ``n/a`` where the platform has none."""
    import os

    try:
        return f"{os.getloadavg()[0]:.1f}"
    except (AttributeError, OSError):
        return "n/a"


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
