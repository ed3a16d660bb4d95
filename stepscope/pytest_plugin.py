"""pytest plugin (entry point ``pytest11``): profile a few training steps inside a test and fail
the test when they break a budget against a baseline, like pytest-memray's ``limit_memory``::

    @pytest.mark.stepscope(steps=5, budget={"step_time": "+5%"}, baseline="perf/baseline")
    def test_train_step_speed(stepscope_profile):
        for _ in range(stepscope_profile.total_steps):
            train_step()
            stepscope_profile.step()

``baseline`` is a store folder (relative to the rootdir; ``DIR::RUN`` when it holds several
runs), or ``STORE::NAME`` with a baseline name. The candidate goes to a store under the test's
``tmp_path`` (``--stepscope-store DIR`` keeps it). With ``--stepscope-save-baseline`` the run is
stored as the baseline instead of being judged. torch is imported only when a test asks for
``stepscope_profile``, so projects without torch can run pytest with the plugin installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

_PROFILE = pytest.StashKey[Any]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("stepscope")
    group.addoption("--stepscope-store", default=None, help="store for the profiled runs (default: tmp_path)")
    group.addoption("--stepscope-save-baseline", action="store_true", default=False,
                    help="store the profiled runs as the markers' baselines instead of judging them")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "stepscope(steps=5, budget=None, baseline=None, warmup=1): profile "
                                       "`steps` training steps with the stepscope_profile fixture and fail "
                                       "on a budget against the baseline")


class _Session:
    """What the fixture started: the profile, where it writes, and the marker's settings."""

    def __init__(self, profile: Any, store: Path, run: str, options: dict[str, Any]) -> None:
        self.profile, self.store, self.run, self.options = profile, store, run, options
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.profile.__exit__(None, None, None)


@pytest.fixture
def stepscope_profile(request: pytest.FixtureRequest, tmp_path: Path):  # noqa: ANN201 - a collector Profile
    """A running ``stepscope.profile``; call ``.step()`` after each training step. Its
    ``total_steps`` is how many steps the marker's schedule needs (warm-up plus recorded)."""
    import stepscope

    marker = request.node.get_closest_marker("stepscope")
    options = dict(marker.kwargs) if marker else {}
    steps, warmup = int(options.get("steps", 5)), int(options.get("warmup", 1))
    root = request.config.getoption("--stepscope-store")
    store = Path(root) if root else tmp_path / "stepscope-store"
    run = request.node.name
    profile = stepscope.profile(store=store, run=run, wait=0, warmup=warmup, active=steps)
    profile.total_steps = warmup + steps
    session = _Session(profile, store, run, options)
    request.node.stash[_PROFILE] = session
    profile.__enter__()
    try:
        yield profile
    finally:
        session.close()


def _baseline_path(config: pytest.Config, baseline: str) -> tuple[Path, str | None]:
    folder, sep, name = baseline.partition("::")
    path = Path(folder)
    if not path.is_absolute():
        path = Path(config.rootpath) / path
    return path, (name if sep else None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):  # noqa: ANN201 - hook wrapper
    yield
    session = item.stash.get(_PROFILE, None)
    if session is None:
        return
    session.close()
    baseline = session.options.get("baseline")
    if not baseline:
        return
    path, name = _baseline_path(item.config, baseline)
    if item.config.getoption("--stepscope-save-baseline"):
        _save_baseline(session, path)
        return
    if not (path / "sources").is_dir():
        pytest.skip(f"stepscope: no baseline store at {path} (record one with --stepscope-save-baseline)")
    from stepscope.commands.compare import gate
    from stepscope.render.compare_text import render_text

    budget = session.options.get("budget") or {}
    fail_on = [f"{metric}:{value}" for metric, value in budget.items()]
    spec = f"{path}::{name}" if name else str(path)
    if name:
        from stepscope.store.baselines import baseline_run

        spec = f"{path}::{baseline_run(path, name) or name}"
    comparison, verdict = gate(spec, f"{session.store}::{session.run}", None, fail_on, None, None)
    if verdict.status != "pass":
        pytest.fail(f"stepscope: {verdict.status}\n" + render_text(comparison, verdict), pytrace=False)


def _save_baseline(session: _Session, path: Path) -> None:
    """Copy the run's partitions into the baseline store (replacing an earlier baseline run)."""
    import shutil

    for table_dir in session.store.iterdir():
        source = table_dir / f"run={session.run}"
        if source.is_dir():
            target = path / table_dir.name / f"run={session.run}"
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target)
