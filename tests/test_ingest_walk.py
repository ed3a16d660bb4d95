"""Every file under ../shared/traces either ingests or is refused with one ``<file>: <problem>`` line."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from stepscope.errors import TraceFormatError
from stepscope.store import open_store
from stepscope.store.ingest import ingest_trace_file

NOT_TRACES = {"MANIFEST.md"}
NOT_KINETO = ("execution_details.json", "_et.json.gz", "memory_timeline.raw.gz", ".pickle")
"""As tests/test_one_truth.py: the files the other tests never read as Kineto traces."""


def test_every_shared_file_ingests_or_is_refused_cleanly(shared_traces: Path, tmp_path: Path,
                                                        ingested: Callable[[str], Path]) -> None:
    """A Kineto trace is read from the session's store of it (``ingested``, the ingest every other
    test reads: it fails on any refusal or crash); every other file is ingested here and must be
    stored, or refused with a ``TraceFormatError`` of one line naming the file."""
    stored: dict[Path, tuple[Path, str, int | None]] = {}
    refused: dict[Path, str] = {}
    files = sorted(p for p in shared_traces.rglob("*")
                   if p.is_file() and p.name not in NOT_TRACES and "LICENSES" not in p.parts)
    assert len(files) > 50
    for index, path in enumerate(files):
        if path.name.endswith((".json", ".json.gz")) and not path.name.endswith(NOT_KINETO):
            stored[path] = (ingested(path.relative_to(shared_traces).as_posix()), "t", None)
            continue
        try:
            outcome = ingest_trace_file(path, tmp_path / "store", f"walk-{index}")
        except TraceFormatError as exc:
            message = str(exc)
            assert message.startswith(f"{path}: ") and "\n" not in message and len(message) < 400
            refused[path] = message
            continue
        stored[path] = (tmp_path / "store", outcome.run, outcome.events)
    names = {p.name for p in refused}
    assert {"benchmark_simple_add_et.json.gz", "memory_snapshot.pickle", "memory_timeline.raw.gz",
            "execution_details.json"} <= names
    assert len(stored) >= 52
    for path, (root, run, events) in stored.items():
        store = open_store(root)
        [counts] = store.sql(f"SELECT count(*) AS sources, sum(event_count) AS events FROM sources "
                             f"WHERE run = '{run}'").to_pylist()
        [rows] = store.sql(f"SELECT count(*) AS n FROM events WHERE run = '{run}'").to_pylist()
        assert counts["sources"] >= 1 and counts["events"] == rows["n"] > 0, path
        if events is not None:
            assert counts["events"] == events, path
