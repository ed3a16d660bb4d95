"""Read a Kineto trace file (``*.pt.trace.json[.gz]``) into typed records, or say why not.

Decoding is typed (msgspec Structs) because parsing dominates ingest time: a typed decode of
the 54 MB ``df_index_resolver`` trace takes ~0.35 s here against ~0.55 s for orjson into dicts
(see benchmarks/bench_ingest.py). ``args`` stay raw JSON bytes: they are stored verbatim and only
the fields the schema types are decoded, per event, by a second small typed decoder.

Every failure becomes one ``TraceFormatError`` whose message is ``<file>: <problem>``.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Union

import msgspec

from stepscope.errors import TraceFormatError
from stepscope.store.dedupe import content_sha256
from stepscope.store.files import NotRegularFile, read_regular_file
from stepscope.store.schema import INT64_MAX, out_of_range

GZIP_MAGIC = b"\x1f\x8b"


class TraceEvent(msgspec.Struct, gc=False):
    """One Chrome-trace event as Kineto writes it; unknown keys are ignored."""

    ph: str = ""
    name: Union[str, None] = None
    cat: Union[str, None] = None
    ts: Union[int, float, None] = None
    dur: Union[int, float, None] = None
    pid: Union[int, str, None] = None
    tid: Union[int, str, None] = None
    id: Union[int, str, None] = None
    args: msgspec.Raw = msgspec.Raw()


class ExactTimeEvent(TraceEvent, gc=False):
    """The same event with ``ts`` kept as an exact decimal.

    Used only for traces whose absolute epoch-microsecond ``ts`` carry fractions: float64 holds
    such values only to ~0.12 us, and the store promises the recorded digits.
    """

    ts: Union[Decimal, None] = None


class EventArgs(msgspec.Struct, gc=False):
    """The ``args`` keys that the store types into columns. The rest stay in the JSON text."""

    correlation: Union[int, None] = None
    external_id: Union[int, None] = msgspec.field(default=None, name="External id")
    stream: Union[int, None] = None
    device: Union[int, None] = None
    bytes: Union[int, None] = None
    addr: Union[int, None] = msgspec.field(default=None, name="Addr")
    signed_bytes: Union[int, None] = msgspec.field(default=None, name="Bytes")
    total_allocated: Union[int, None] = msgspec.field(default=None, name="Total Allocated")
    total_reserved: Union[int, None] = msgspec.field(default=None, name="Total Reserved")
    device_type: Union[int, None] = msgspec.field(default=None, name="Device Type")
    device_id: Union[int, None] = msgspec.field(default=None, name="Device Id")
    collective: Union[str, None] = msgspec.field(default=None, name="Collective name")
    in_nelems: Union[int, None] = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Union[int, None] = msgspec.field(default=None, name="Out msg nelems")
    group_size: Union[int, None] = msgspec.field(default=None, name="Group size")
    dtype: Union[str, None] = None
    pg_name: Union[str, None] = msgspec.field(default=None, name="Process Group Name")
    pg_desc: Union[str, None] = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: Union[str, list[int], None] = msgspec.field(default=None, name="Process Group Ranks")
    seq: Union[int, None] = msgspec.field(default=None, name="Seq")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")


_TOP_KEYS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_EVENTS = msgspec.json.Decoder(list[TraceEvent])
_EXACT_EVENTS = msgspec.json.Decoder(list[ExactTimeEvent])
FLOAT64_EXACT_US = 2.0**33
"""Above ~8.6e9 us a float64 microsecond no longer resolves 1 ns: such fractional ts are re-read."""
ARGS_DECODER = msgspec.json.Decoder(EventArgs)
_ANY = msgspec.json.Decoder()


@dataclass(frozen=True)
class RawTrace:
    """A decoded trace: its events plus the top-level metadata Kineto writes beside them."""

    path: str
    sha256: str
    content_sha256: str
    """Hash of the JSON text with whitespace outside strings removed (``dedupe.content_sha256``)."""
    file_bytes: int
    events: list[TraceEvent]
    base_time_ns: int
    schema_version: str | None
    device_properties: list[dict[str, Any]]
    distributed_info: dict[str, Any]
    metadata: dict[str, Any]


def _gunzip(data: bytes) -> bytes:
    """All gzip members of ``data``, decompressed into one buffer.

    ``gzip.decompress`` joins a list of member buffers, an extra copy of the whole text (54 MB
    for df_index_resolver, ~35 ms); a single-member file, the usual case, needs none here.
    Raises EOFError when the stream is cut short, zlib.error when it is corrupt.
    """
    text = b""
    while data:
        member = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # expect a gzip header
        chunk = member.decompress(data)
        if not member.eof:
            raise EOFError("compressed data ended before the end-of-stream marker")
        text = text + chunk if text else chunk
        data = member.unused_data
    return text


def read_bytes(path: Path) -> tuple[bytes, str, int]:
    """The file's JSON text, the sha256 of its bytes on disk, and its size on disk."""
    try:
        data = read_regular_file(path)
    except NotRegularFile as exc:
        raise TraceFormatError(path, str(exc)) from exc
    except OSError as exc:
        raise TraceFormatError(path, f"cannot read file ({exc.strerror or exc})") from exc
    digest = hashlib.sha256(data).hexdigest()
    if not data:
        raise TraceFormatError(path, "empty file")
    if data[:2] == GZIP_MAGIC:
        try:
            text = _gunzip(data)
        except EOFError as exc:
            raise TraceFormatError(path, "truncated gzip stream (file cut short)") from exc
        except (OSError, zlib.error) as exc:
            raise TraceFormatError(path, f"corrupt gzip data ({exc})") from exc
    elif path.name.endswith(".gz"):
        raise TraceFormatError(path, "not gzip data although the name ends in .gz")
    else:
        text = data
    if not text or text.isspace():  # not .strip(): that copies the whole text
        raise TraceFormatError(path, "empty trace (no JSON text)")
    return text, digest, len(data)


def _not_kineto_reason(text: bytes) -> str:
    """Why a JSON document that has no ``traceEvents`` object is not a Kineto trace."""
    try:
        doc = _ANY.decode(text)
    except msgspec.DecodeError as exc:
        return f"not valid JSON ({exc})"
    if isinstance(doc, list):
        return "not a Kineto trace: the JSON is a bare array, not an object with traceEvents"
    if isinstance(doc, dict) and "nodes" in doc:
        return "not a Kineto trace: this is a PyTorch Execution Trace (it has 'nodes', no traceEvents)"
    return "not a Kineto trace: no traceEvents list"


def decode(path: str | Path) -> RawTrace:
    """Decode one trace file. Raises ``TraceFormatError`` naming the file and the problem."""
    path = Path(path)
    text, digest, size = read_bytes(path)
    try:
        return _decode_text(path, text, digest, size)
    except RecursionError as exc:
        # The decoder recurses per nesting level, up to Python's recursion limit (~1000); no
        # Kineto trace nests more than a few levels.
        raise TraceFormatError(path, "JSON nested too deeply (more than ~1000 levels)") from exc


def _decode_text(path: Path, text: bytes, digest: str, size: int) -> RawTrace:
    try:
        top = _TOP_KEYS.decode(text)
    except msgspec.DecodeError as exc:
        raise TraceFormatError(path, _not_kineto_reason(text) if "Expected `object`" in str(exc)
                               else f"not valid JSON ({exc})") from exc
    raw_events = top.get("traceEvents")
    if raw_events is None:
        raise TraceFormatError(path, _not_kineto_reason(text))
    content = content_sha256(text)  # before the events exist: its buffer adds nothing to the peak
    try:
        events = _EVENTS.decode(raw_events)
    except msgspec.ValidationError as exc:
        raise TraceFormatError(path, f"malformed event ({exc})") from exc
    except msgspec.DecodeError as exc:
        raise TraceFormatError(path, f"not valid JSON ({exc})") from exc
    if any(type(e.ts) is float and e.ts > FLOAT64_EXACT_US and not e.ts.is_integer() for e in events):
        events = _EXACT_EVENTS.decode(raw_events)
    meta = {key: _ANY.decode(value) for key, value in top.items() if key != "traceEvents"}
    base = meta.pop("baseTimeNanoseconds", 0)
    if not isinstance(base, int) or isinstance(base, bool) or base < 0:
        raise TraceFormatError(path, f"baseTimeNanoseconds is not a non-negative integer: {base!r}")
    if base > INT64_MAX:
        raise TraceFormatError(path, out_of_range("baseTimeNanoseconds", base, "nanoseconds"))
    devices = meta.pop("deviceProperties", None) or meta.pop("computeProperties", None) or []
    dist = meta.pop("distributedInfo", None) or {}
    schema = meta.pop("schemaVersion", None)
    return RawTrace(
        path=str(path),
        sha256=digest,
        content_sha256=content,
        file_bytes=size,
        events=events,
        base_time_ns=base,
        schema_version=None if schema is None else str(schema),
        device_properties=[d for d in devices if isinstance(d, dict)] if isinstance(devices, list) else [],
        distributed_info=dist if isinstance(dist, dict) else {},
        metadata=meta,
    )
