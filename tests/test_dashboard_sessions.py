"""Dashboard visitors do not share a connection: each browser session queries through one of its
own (``Store.session``, a cursor on the server's database), and one session's time limit never
interrupts another session's query (two sessions at once, on the store and on the SQL page)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("streamlit")

from streamlit.testing.v1 import AppTest  # noqa: E402

from stepscope.errors import InternalError  # noqa: E402
from stepscope.store import open_store  # noqa: E402
from tests._dashboard_stores import build_sample_store  # noqa: E402
from tests.conftest import REPO  # noqa: E402

APP = REPO / "stepscope" / "dashboard" / "app.py"
SLOW = "SELECT count(*) AS n FROM range(600000000) r(i) WHERE hash(i) % 7 = 3"
"""A query that runs for seconds (about 3 s on the 2-core CI machine)."""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sample_store(tmp_path_factory)


def _concurrently(slow: Any, limited: Any) -> dict[str, tuple[float, float, Any]]:
    """Start ``slow()``, and while it runs, ``limited()``; each one's (start, end, result)."""
    out: dict[str, tuple[float, float, Any]] = {}

    def timed(name: str, call: Any) -> None:
        started = time.monotonic()
        try:
            result = call()
        except Exception as exc:  # noqa: BLE001 - the result under test
            result = exc
        out[name] = (started, time.monotonic(), result)

    thread = threading.Thread(target=timed, args=("slow", slow))
    thread.start()
    time.sleep(0.5)
    timed("limited", limited)
    thread.join(timeout=120)
    return out


def test_a_sessions_interrupt_stops_only_its_own_query(store: Path) -> None:
    with open_store(store) as shared:
        a, b = shared.session(), shared.session()
        assert a.sql("SELECT count(*) AS n FROM memory_snapshot").to_pylist() == [{"n": 0}]  # views shared

        def limited() -> Any:
            timer = threading.Timer(0.3, b.interrupt)  # b's time limit
            timer.start()
            try:
                return b.sql(SLOW)
            finally:
                timer.cancel()

        out = _concurrently(lambda: a.sql(SLOW), limited)
    slow_start, slow_end, slow = out["slow"]
    _, limited_end, stopped = out["limited"]
    assert isinstance(stopped, InternalError) and "INTERRUPT" in str(stopped).upper()
    assert not isinstance(slow, Exception) and slow.to_pylist()[0]["n"] > 0, slow
    assert slow_start < limited_end < slow_end  # the limit fired while the other query ran


def _sql_page(root: Path, monkeypatch: pytest.MonkeyPatch, limit_s: float) -> AppTest:
    monkeypatch.setattr(sys, "argv", ["app.py", "--store", str(root)])
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    at.switch_page("views/sql.py")
    at.run()
    at.session_state["sql_time_limit_s"] = limit_s
    at.text_area(key="sql_query").set_value(SLOW)
    return at


def test_two_sessions_on_the_sql_page(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    patient, hurried = _sql_page(store, monkeypatch, 120.0), _sql_page(store, monkeypatch, 0.3)
    out = _concurrently(lambda: patient.button[0].click().run(), lambda: hurried.button[0].click().run())
    assert not isinstance(out["slow"][2], Exception) and not isinstance(out["limited"][2], Exception)
    assert hurried.error and "stopped after the 0.3 s limit" in hurried.error[0].value
    assert not patient.error and not patient.exception, [e.value for e in patient.error]
    assert patient.dataframe[-1].value["n"].tolist()[0] > 0
    assert out["slow"][0] < out["limited"][1] < out["slow"][1]


def _session_app(root: str) -> None:
    """A one-line app: the identity of the store this session's analyses would query through."""
    import streamlit as st

    from stepscope.dashboard._data import _open, store_for

    store = store_for(root)
    st.session_state.setdefault("first", id(store))
    st.session_state["now"] = id(store)
    st.session_state["shared"] = store is _open(root)


def test_each_session_queries_through_a_connection_of_its_own(store: Path) -> None:
    sessions = [AppTest.from_function(_session_app, args=(str(store),), default_timeout=60) for _ in range(2)]
    for at in sessions:
        at.run()
        at.run()  # a rerun keeps the session's connection
        assert not at.exception and at.session_state["first"] == at.session_state["now"]
        assert at.session_state["shared"] is False
    assert sessions[0].session_state["now"] != sessions[1].session_state["now"]
