"""Give a rank's trace back as a Chrome-trace JSON that Perfetto (or chrome://tracing) opens.

The store keeps no copy of the ingested file (store size target). ``sources.path`` says where it
was ingested from: :func:`original_trace` returns that file when it is still there with the same
sha256; otherwise :func:`export_chrome_trace` rebuilds the trace from the ``events`` view (and the
``sources`` row's top-level keys), so that ingesting the export again yields the same events.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import msgspec

from stepscope.store.catalog import Store

KINETO_CAT: dict[str, str] = {
    "cpu_op": "cpu_op",
    "python_function": "python_function",
    "user_annotation": "user_annotation",
    "gpu_annotation": "gpu_user_annotation",
    "cuda_runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver",
    "kernel": "kernel",
    "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
    "memory": "cpu_instant_event",
    "flow": "ac2g",
    "other": "other",
}
"""``events.kind`` -> the Kineto ``cat`` that ingest classifies back into the same kind."""

_EVENTS_QUERY = """
SELECT kind::VARCHAR AS kind, name, ph::VARCHAR AS ph, ts_ns, dur_ns, pid, tid, thread_label, flow_id, args
FROM events WHERE run = $run AND rank = $rank
ORDER BY source, ts_ns NULLS FIRST
"""

_SOURCES_QUERY = """
SELECT source, path, sha256, trace_schema_version, device_properties, distributed_info, metadata
FROM sources WHERE run = $run AND rank = $rank ORDER BY ingested_at, source
"""


def _json(text: str | None) -> Any:
    return msgspec.json.decode(text) if text else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def original_trace(store: Store, run: str, rank: int) -> Path | None:
    """The file this rank was ingested from, if the rank has one trace and the file is still
    there unchanged (same sha256); else None."""
    rows = store.sql(_SOURCES_QUERY, {"run": run, "rank": int(rank)}).to_pylist()
    if len(rows) != 1 or not rows[0]["path"]:
        return None
    path = Path(rows[0]["path"])
    try:
        return path if path.is_file() and _sha256(path) == rows[0]["sha256"] else None
    except OSError:
        return None


def _top_level(sources: list[dict[str, Any]]) -> dict[str, Any]:
    """The trace's top-level keys, from the first source of the rank (its metadata included)."""
    first = sources[0]
    top: dict[str, Any] = {}
    metadata = _json(first["metadata"])
    if isinstance(metadata, dict):
        top.update(metadata)
    version = first["trace_schema_version"]
    if version is not None:
        top["schemaVersion"] = int(version) if version.isdigit() else version
    for key, column in (("deviceProperties", "device_properties"), ("distributedInfo", "distributed_info")):
        value = _json(first[column])
        if value is not None:
            top[key] = value
    return top


def export_chrome_trace(store: Store, run: str, rank: int) -> bytes:
    """The rank's events as one Chrome-trace JSON document (bytes, UTF-8).

    Times are written relative to ``baseTimeNanoseconds`` (the first event's whole microsecond)
    so the microsecond values stay small enough for float64 to carry every nanosecond; ingest
    adds the base back. ``cat`` is the Kineto category of the event's ``kind``
    (:data:`KINETO_CAT`), ``args`` are the recorded args verbatim.
    Raises ``KeyError`` when the run has no such rank.
    """
    params = {"run": run, "rank": int(rank)}
    sources = store.sql(_SOURCES_QUERY, params).to_pylist()
    if not sources:
        raise KeyError(f"run {run!r} has no rank {rank}")
    events = store.sql(_EVENTS_QUERY, params)
    columns = {name: events.column(name).to_pylist() for name in events.column_names}
    timed = [t for t in columns["ts_ns"] if t is not None]
    base_ns = (min(timed) // 1000) * 1000 if timed else 0
    out = []
    for i in range(events.num_rows):
        event: dict[str, Any] = {"ph": columns["ph"][i], "cat": KINETO_CAT.get(columns["kind"][i], "other"),
                                 "name": columns["name"][i]}
        ts = columns["ts_ns"][i]
        if ts is not None:
            event["ts"] = (ts - base_ns) / 1000
        dur = columns["dur_ns"][i]
        if dur is not None:
            event["dur"] = dur / 1000
        label = columns["thread_label"][i]
        pid, tid = columns["pid"][i], columns["tid"][i]
        event["pid"] = pid if pid is not None else label
        event["tid"] = tid if tid is not None else label
        if columns["flow_id"][i] is not None:
            event["id"] = columns["flow_id"][i]
            if event["ph"] == "f":
                event["bp"] = "e"
        if columns["args"][i]:
            event["args"] = msgspec.Raw(columns["args"][i].encode())
        out.append(event)
    doc = {**_top_level(sources), "baseTimeNanoseconds": base_ns, "traceEvents": out}
    return msgspec.json.encode(doc)
