"""Every file under ../shared/traces either ingests or is refused with one ``<file>: <problem>`` line."""

from __future__ import annotations

from pathlib import Path

from stepscope.errors import TraceFormatError
from stepscope.store import open_store
from stepscope.store.ingest import ingest_trace_file

NOT_TRACES = {"MANIFEST.md"}


def test_every_shared_file_ingests_or_is_refused_cleanly(shared_traces: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    stored, refused = {}, {}
    files = sorted(p for p in shared_traces.rglob("*")
                   if p.is_file() and p.name not in NOT_TRACES and "LICENSES" not in p.parts)
    assert len(files) > 50
    for index, path in enumerate(files):
        try:
            stored[path] = ingest_trace_file(path, store, f"walk-{index}")
        except TraceFormatError as exc:
            message = str(exc)
            assert message.startswith(f"{path}: ") and "\n" not in message and len(message) < 400
            refused[path] = message
    names = {p.name for p in refused}
    assert {"benchmark_simple_add_et.json.gz", "memory_snapshot.pickle", "memory_timeline.raw.gz",
            "execution_details.json"} <= names
    assert len(stored) >= 52
    counts = open_store(store).sql("SELECT run, event_count FROM sources").to_pylist()
    assert len(counts) == len(stored)
    assert sum(r["event_count"] for r in counts) == sum(o.events for o in stored.values())
