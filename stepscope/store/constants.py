"""The store's format facts that need no Arrow: its schema version and the range of its integers.

A module apart from ``schema`` (which builds Arrow schemas, and importing pyarrow costs ~36 MB of
resident memory): ingest writes its parts with DuckDB and needs only these. ``schema`` re-exports
every name here.
"""

from __future__ import annotations

SCHEMA_VERSION = 6
"""Bump on any change a reader would notice; readers refuse files from a newer version, and a
store of an older one until ``stepscope migrate`` brought it up to date. 2: each rank's answers
computed at ingest (``rank_*`` tables), ``sources.process_id``. 3: the rest of what the summary,
dashboard and compare read per rank (step windows and time lines, FLOP ops, pipeline work,
launches, memory at the peak and its time line) joins those tables. 4: each rank's dependency
edges (``rank_edges``: collective issues, host waits) for the critical path and the replay. 5:
a host wait is a stretch with no op running, annotations aside (an async ``gloo:recv`` no longer
waits for itself). 6: ``rank_hiding_spans.before_ns`` (the stretches' length before each)."""

SCHEMA_VERSION_KEY = b"stepscope.schema_version"
TABLE_KEY = b"stepscope.table"

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""The range of every integer column: a number outside it is refused ("out of range"), never
stored as 0 or wrapped round."""


def out_of_range(what: str, value: object, unit: str = "") -> str:
    """The one wording of that refusal: ``<what> <value> is out of range (...)``, the value cut
    short when it has hundreds of digits."""
    text = str(value)
    if len(text) > 32:
        text = f"{text[:12]}...({len(text)} characters)"
    return f"{what} {text} is out of range (the store holds int64{' ' + unit if unit else ''})"


def file_metadata(table: str) -> dict[bytes, bytes]:
    """Key/value metadata written into every Parquet file of ``table``."""
    return {SCHEMA_VERSION_KEY: str(SCHEMA_VERSION).encode(), TABLE_KEY: table.encode()}


SOURCES_COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("source", "string", False),
    ("run_name", "string", False),
    ("path", "string", True),
    ("sha256", "string", False),
    ("content_sha256", "string", True),
    ("file_bytes", "int64", True),
    ("ingested_at", "timestamp_utc", False),
    ("rank_from", "string", False),
    ("trace_schema_version", "string", True),
    ("trace_start_ns", "int64", True),
    ("trace_end_ns", "int64", True),
    ("event_count", "int64", True),
    ("backend", "string", True),
    ("world_size", "int64", True),
    ("gpu_name", "string", True),
    ("gpu_memory_bytes", "int64", True),
    ("gpu_sm_count", "int64", True),
    ("gpu_count", "int64", True),
    ("device_properties", "string", True),
    ("distributed_info", "string", True),
    ("metadata", "string", True),
    ("tags", "string", True),
    ("process_id", "int64", True),
)
"""``(name, type, nullable)`` of the ``sources`` table, its one definition: ``schema.SOURCES`` is
built from it for Arrow, and ingest writes the row with DuckDB from it (``DUCKDB_TYPES``), so
that committing a trace needs neither pyarrow nor the pandas its row conversion pulls in
(~0.5 s of CPU per process)."""

DUCKDB_TYPES = {"string": "VARCHAR", "int64": "BIGINT", "timestamp_utc": "TIMESTAMPTZ"}
"""The DuckDB type of each type name of ``SOURCES_COLUMNS``."""
