"""No dashboard page shows a traceback, or a section error, on any trace of ../shared/traces.

Each Kineto trace is ingested once per session (the ``ingested`` fixture) into a store of its
own; one AppTest session per trace opens the dashboard (its first page, the Overview) and then
every other page in turn, with what the pages draw only on demand (``_view.on_demand``: tables,
findings' evidence, the Perfetto button) drawn at once, so that it is checked too. Files that
are not Kineto traces (an Execution Trace, a memory-timeline array, a snapshot pickle, TraceLens
sidecars) are refused at ingest, as they should be, and are not pages' business.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from stepscope.dashboard import _view  # noqa: E402
from tests.conftest import REPO, SHARED_TRACES  # noqa: E402

APP = REPO / "stepscope" / "dashboard" / "app.py"
FIRST = "overview"
"""The page the dashboard opens on (app.py's default): the test's first run draws it."""
PAGES = ("runs", "communication", "copies", "memory", "kernels", "pipeline", "compare", "sql")
"""Every other page, opened in turn after it."""
NOT_KINETO = ("execution_details.json", "_et.json.gz", "memory_timeline.raw.gz", ".pickle")
TRACES = sorted(p.relative_to(SHARED_TRACES).as_posix() for p in SHARED_TRACES.rglob("*")
                if p.is_file() and p.name.endswith((".json", ".json.gz")) and not p.name.endswith(NOT_KINETO)
                and p.parent.name != "LICENSES") if SHARED_TRACES.is_dir() else []


@pytest.mark.shared
@pytest.mark.slow
@pytest.mark.parametrize("relative", TRACES)
def test_every_page_renders_on_every_shared_trace(relative: str, ingested, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["app.py", "--store", str(ingested(relative))])
    monkeypatch.setattr(_view, "on_demand", _drawn_at_once)
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.run()
    _assert_drawn(at, FIRST)
    assert at.title[0].value.startswith("Overview"), [t.value for t in at.title]
    for page in PAGES:
        at.switch_page(f"views/{page}.py")
        at.run()
        _assert_drawn(at, page)


def _drawn_at_once(label: str, key: str, draw: Callable[[], None], *, icon: str | None = None) -> None:
    """``_view.on_demand`` as if every such expander had been opened (the pages import it when
    they run, so the patch reaches them)."""
    draw()


def _assert_drawn(at: AppTest, page: str) -> None:
    """The page's run showed no traceback, no section error, and its title."""
    assert not at.exception, (page, [e.value for e in at.exception])
    assert not at.error, (page, [e.value for e in at.error])
    assert at.title, (page, "no title")
