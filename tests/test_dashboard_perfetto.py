"""Perfetto in one click: the page hands the rank's trace to ui.perfetto.dev the documented way
(window.open, PING until PONG, postMessage of the trace as an ArrayBuffer with keepApiOpen), then
scrolls to the step's window, given in the time domain of the trace it handed over."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path

from stepscope.dashboard._perfetto import PERFETTO_ORIGIN, open_button_html, rank_trace, trace_seconds
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from tests.conftest import REPO


def test_the_button_posts_the_trace_then_the_step(tmp_path: Path) -> None:
    folder = REPO / "sample_traces" / "gloo-3ranks-late"
    assert ingest_paths(sorted(folder.glob("*.json.gz")), tmp_path / "s", "late").ok
    store = open_store(tmp_path / "s")
    data, base = rank_trace(store, "late", 2)
    doc = json.loads(gzip.decompress(data))
    assert doc["baseTimeNanoseconds"] == base  # the domain Perfetto reads the handed-over ts in
    step = store.sql("SELECT start_ns, end_ns FROM rank_step_windows WHERE run = 'late' AND rank = 2 "
                     "ORDER BY step LIMIT 1").to_pylist()[0]
    start, end = trace_seconds(step["start_ns"], base), trace_seconds(step["end_ns"], base)
    # the step's window, as the handed-over trace's own events place it (ts in us after the base)
    steps = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    first = min(e["ts"] for e in steps) / 1e6
    assert abs(start - first) < 0.05 and end > start
    page = open_button_html(data, "late rank 2 step 2", "late-rank2.pt.trace.json.gz", start, end)
    assert f"window.open(ORIGIN)" in page and json.dumps(PERFETTO_ORIGIN) in page
    assert 'postMessage("PING", ORIGIN)' in page and 'evt.data !== "PONG"' in page
    assert "keepApiOpen: true" in page and json.dumps({"timeStart": start, "timeEnd": end}) in page
    assert base64.b64encode(data).decode() in page
