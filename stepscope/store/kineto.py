"""What a Kineto trace file holds besides its events: identity, clock base, devices, ranks.

The events themselves stream to disk in pieces (``textstream`` -> ``split``) and are converted by
DuckDB (``convert``); this module reads the file through that pipeline and interprets the
top-level keys Kineto writes beside ``traceEvents``: ``baseTimeNanoseconds`` (newer traces: ``ts``
is relative to it), ``deviceProperties`` (or the old ``computeProperties``), ``distributedInfo``,
``schemaVersion``; the rest is kept as metadata.

Every failure is one ``TraceFormatError`` whose message is ``<file>: <problem>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from stepscope.errors import TraceFormatError
from stepscope.store.constants import INT64_MAX, out_of_range
from stepscope.store.split import split_trace
from stepscope.store.textstream import TextStream


@dataclass(frozen=True)
class KinetoTrace:
    """A trace read through: its events' piece files plus the facts beside them."""

    path: str
    sha256: str
    content_sha256: str
    """sha256 of the JSON text with whitespace outside strings removed (``split.py``)."""
    file_bytes: int
    pieces: list[Path]
    base_time_ns: int
    schema_version: str | None
    device_properties: list[dict[str, Any]]
    distributed_info: dict[str, Any]
    metadata: dict[str, Any]


def read_trace(path: str | Path, workdir: Path,
               on_piece: Callable[[Path], None] | None = None) -> KinetoTrace:
    """Read one trace file, writing its events as pieces under ``workdir`` (each handed to
    ``on_piece`` as it is written). Raises ``TraceFormatError`` naming the file and the problem."""
    path = Path(path)
    stream = TextStream(path)
    split = split_trace(path, stream.blocks(), workdir, on_piece)
    meta = dict(split.top)
    base = meta.pop("baseTimeNanoseconds", 0)
    if not isinstance(base, int) or isinstance(base, bool) or base < 0:
        raise TraceFormatError(path, f"baseTimeNanoseconds is not a non-negative integer: {base!r}")
    if base > INT64_MAX:
        raise TraceFormatError(path, out_of_range("baseTimeNanoseconds", base, "nanoseconds"))
    devices = meta.pop("deviceProperties", None) or meta.pop("computeProperties", None) or []
    dist = meta.pop("distributedInfo", None) or {}
    schema = meta.pop("schemaVersion", None)
    return KinetoTrace(
        path=str(path),
        sha256=stream.sha256,
        content_sha256=split.content_sha256,
        file_bytes=stream.file_bytes,
        pieces=split.pieces,
        base_time_ns=base,
        schema_version=None if schema is None else str(schema),
        device_properties=[d for d in devices if isinstance(d, dict)] if isinstance(devices, list) else [],
        distributed_info=dist if isinstance(dist, dict) else {},
        metadata=meta,
    )
