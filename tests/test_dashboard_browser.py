"""End to end: `stepscope dashboard` serves every page to a real headless Chromium.

Starts the command on a free port, waits for ``/_stcore/health``, loads each page over the
DevTools protocol, waits until Streamlit has rendered it (title present, script finished, the
page's charts drawn), checks that no exception or error is shown, and saves a screenshot to
``test-artifacts/screenshots/<page>.png``. Skips when no Chromium is installed (CI installs
Debian's ``chromium`` with ``.ci/install_chromium.sh``).
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests._browser import Browser, find_chromium, free_port, wait_http
from tests._dashboard_stores import build_sample_store, build_shared_store
from tests.conftest import REPO, SHARED_TRACES, built_once, copy_run

SCREENSHOTS = REPO / "test-artifacts" / "screenshots"
SHARED_RUNS_SHOWN = ("sampled", "control")
"""The runs of ``tests._dashboard_stores.SHARED_RUNS`` the browser opens: ``sampled`` against
the baseline ``control``."""
MIN_CHARTS_ON_SHARED = {"overview": 1, "communication": 1, "copies": 3, "kernels": 3, "compare": 1}
"""Charts each page must draw for the shared run ``sampled`` against baseline ``control``, as it
opens (the Overview: the step timeline; its other sections are drawn when opened)."""
OVERVIEW_SECTIONS = ("Where each step's GPU time goes", "Where each step's host (CPU) time goes",
                     "Step time over the whole run")
"""The Overview's sections drawn on demand: opened in the browser, they bring its charts to at
least :data:`MIN_CHARTS_OVERVIEW_OPENED`."""
MIN_CHARTS_OVERVIEW_OPENED = 4
PAGES = ("overview", "runs", "communication", "copies", "memory", "kernels", "pipeline", "compare", "sql")


@pytest.fixture(scope="module")
def chromium() -> str:
    path = find_chromium()
    if path is None:
        pytest.skip("no chromium installed (CI installs it: .ci/install_chromium.sh)")
    return path


def _browser_store(tmp_path_factory: pytest.TempPathFactory, root: Path) -> None:
    """The sample runs (a copy of the shared sample store, without the analysis cache that
    other tests may be writing into it meanwhile), plus the runs ``SHARED_RUNS_SHOWN`` when
    ../shared is there, copied from the dashboard tests' store of shared runs (ingested once
    per test run: :func:`tests._dashboard_stores.build_shared_store`)."""
    shutil.copytree(build_sample_store(tmp_path_factory), root, ignore=shutil.ignore_patterns("cache", "*.tmp"))
    if SHARED_TRACES.is_dir():
        shared = build_shared_store(tmp_path_factory)
        for run in SHARED_RUNS_SHOWN:
            copy_run(shared, root, run)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, chromium: str):
    """``(base_url, query, shared)`` of a running ``stepscope dashboard``."""
    shared = SHARED_TRACES.is_dir()
    store = built_once(tmp_path_factory, "dash-browser", functools.partial(_browser_store, tmp_path_factory))
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "dashboard.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "stepscope.cli", "dashboard", "--store", str(store), "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
        )
    try:
        wait_http(f"http://127.0.0.1:{port}/_stcore/health", 60)
        query = "?run=sampled&baseline=control" if shared else ""
        yield f"http://127.0.0.1:{port}", query, shared
    finally:
        server.terminate()
        server.wait(timeout=20)
    assert f"http://127.0.0.1:{port}/" in log.read_text(), "the command must print the URL"


@pytest.fixture(scope="module")
def browser(chromium: str, tmp_path_factory: pytest.TempPathFactory):
    b = Browser(chromium, tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


def test_every_page_renders_in_chromium(served, browser: Browser) -> None:
    base, query, shared = served
    problems = []
    for page in PAGES:
        path = "" if page == "overview" else page  # the default page lives at the root URL
        min_charts = MIN_CHARTS_ON_SHARED.get(page, 0) if shared else 0
        state = browser.open(f"{base}/{path}{query}", min_charts=min_charts)
        if page == "overview" and shared and not (state["exceptions"] or state["errors"] or state.get("timed_out")):
            state = browser.expand(OVERVIEW_SECTIONS, min_charts=MIN_CHARTS_OVERVIEW_OPENED)
            min_charts = MIN_CHARTS_OVERVIEW_OPENED
        browser.screenshot(SCREENSHOTS / f"{page}.png")
        if state["exceptions"] or state["errors"] or state.get("timed_out") or not state["title"]:
            problems.append((page, state))
        elif state["charts"] < min_charts:
            problems.append((page, state))
    assert not problems, problems
