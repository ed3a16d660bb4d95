"""A running dashboard sees what is ingested after it opened the store (issue 20, item 3).

The server opens the store once (one ``Store``, its views naming the files listed then); a page
run starts ``Store.refresh()`` in the background at most every few seconds, and when it found the
files changed the runs table is recomputed, so a run ingested while the server runs is listed and
shown without a restart, and no page waits for the listing. Checked in Streamlit's AppTest: one session
opens the Overview, a second run is ingested into the same store, the runs table's few-second
cache is let go, and the same session lists the new run and draws its Overview from its own
traces. A first open lists the store's files once, not once to open it and again for the runs
table (at 1,024 ranks a listing takes ~0.4 s).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from stepscope.store.catalog import Store  # noqa: E402
from stepscope.store.ingest import ingest_paths  # noqa: E402
from tests.conftest import REPO  # noqa: E402

APP = REPO / "stepscope" / "dashboard" / "app.py"
SAMPLES = REPO / "sample_traces"


def test_a_run_ingested_while_the_dashboard_runs_is_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stepscope.dashboard import _data
    from stepscope.dashboard._data import runs_table

    root = tmp_path / "store"
    assert ingest_paths([SAMPLES / "cpu-transformer"], root, "first").ok
    monkeypatch.setattr(sys, "argv", ["app.py", "--store", str(root)])
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    at.switch_page("views/overview.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="run").options == ["first"]

    report = ingest_paths([SAMPLES / "gloo-3ranks-late"], root, "second")
    assert report.ok, report.errors
    # the table's cache let go (a "Clear caches" from the page's menu) once the last listing is
    # older than REVALIDATE_S (0 here, not a few seconds of waiting): the next page run lists again
    monkeypatch.setattr(_data, "REVALIDATE_S", 0.0)
    runs_table.clear()
    at.run()
    assert at.selectbox(key="run").options == ["first", "second"]
    at.selectbox(key="run").set_value("second").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Overview: second"
    # the new run's own traces: three ranks traced (the verdict's first line says so)
    assert any("3 ranks traced" in m.value for m in at.markdown), [m.value for m in at.markdown][:3]


def test_the_background_listing_finds_a_run_ingested_later(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the cache let go by hand: a page run starts the listing in the background (here at
    once, ``REVALIDATE_S`` 0), the page it ran in draws what it knew, and a later page run lists
    the new run."""
    from stepscope.dashboard import _data

    root = tmp_path / "store"
    assert ingest_paths([SAMPLES / "cpu-transformer"], root, "first").ok
    monkeypatch.setattr(sys, "argv", ["app.py", "--store", str(root)])
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    assert at.selectbox(key="run").options == ["first"]
    assert ingest_paths([SAMPLES / "gloo-3ranks-late"], root, "second").ok
    monkeypatch.setattr(_data, "REVALIDATE_S", 0.0)
    listed_in: list[str] = []
    refresh = Store.refresh

    def recorded(self: Store) -> bool:
        listed_in.append(threading.current_thread().name)
        return refresh(self)

    monkeypatch.setattr(Store, "refresh", recorded)
    for _ in range(200):  # each page run starts a listing when none runs; one of them finds the run
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        if at.selectbox(key="run").options == ["first", "second"]:
            break
        time.sleep(0.05)
    assert at.selectbox(key="run").options == ["first", "second"]
    # the page runs never listed the files themselves until the cache was let go: the first
    # listing ran in the background, and found the run
    assert listed_in[0] == "stepscope-store-listing", listed_in


def test_a_first_open_lists_the_store_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store opened for the first page run is listed when it opens; the runs table computed
    right after reads that listing instead of listing the files again (the background listing
    starts only after :data:`REVALIDATE_S`)."""
    from stepscope.store import compact

    root = tmp_path / "store"
    assert ingest_paths([SAMPLES / "cpu-transformer"], root, "first").ok
    monkeypatch.setattr(sys, "argv", ["app.py", "--store", str(root)])
    listings: list[str] = []
    read_plan = compact.read_plan

    def recorded(*args: object, **kwargs: object) -> compact.ReadPlan:
        listings.append(threading.current_thread().name)
        return read_plan(*args, **kwargs)

    monkeypatch.setattr(compact, "read_plan", recorded)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.switch_page("views/overview.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="run").options == ["first"]
    assert len(listings) == 1, listings
