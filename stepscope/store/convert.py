"""Turn a decoded Kineto trace into the store's Arrow tables (events, steps, memory).

Column building is one list comprehension per column and numpy for arithmetic, never one Python
statement per event per column: this is the part of ingest that is ours to make fast.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Callable, Sequence

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stepscope.errors import TraceFormatError
from stepscope.store import schema
from stepscope.store.schema import INT64_MAX, INT64_MIN, out_of_range
from stepscope.store.classify import classify, dtype_bytes, normalise_collective
from stepscope.store.kineto import ARGS_DECODER, EventArgs, ExactTimeEvent, RawTrace

STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
STEP_KINDS = frozenset({"user_annotation", "cpu_op"})
GPU_SIDE_KINDS = frozenset({"kernel", "memcpy", "memset", "gpu_annotation"})
LAUNCH_KINDS = frozenset({"cuda_runtime", "cuda_driver"})

_EMPTY_ARGS = EventArgs()
_NO_ARGS = msgspec.Raw()


@dataclass(frozen=True)
class TraceTables:
    """The rows one trace file contributes to each table, plus facts for its ``sources`` row."""

    events: pa.Table
    steps: pa.Table
    memory: pa.Table
    start_ns: int | None
    end_ns: int | None
    main_device: int | None


def _decode_args(path: str, raw: msgspec.Raw, index: int) -> EventArgs:
    if not raw:
        return _EMPTY_ARGS
    try:
        return ARGS_DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        return _lenient_args(path, raw, index, exc)


def _lenient_args(path: str, raw: msgspec.Raw, index: int, error: Exception) -> EventArgs:
    """Typed fields with an unexpected JSON type (a string correlation, say) become null.

    The raw args keep the value; only its typed copy is dropped. JSON that does not parse at all
    cannot reach here: the whole file was parsed already.
    """
    doc = msgspec.json.decode(raw)
    if not isinstance(doc, dict):
        raise TraceFormatError(path, f"event {index}: args is not an object ({error})")
    fields = {}
    for field in msgspec.structs.fields(EventArgs):
        value = doc.get(field.encode_name)
        try:
            fields[field.name] = msgspec.convert(value, field.type) if value is not None else None
        except msgspec.ValidationError:
            fields[field.name] = None
    for name in ("input_dims", "input_type"):
        fields[name] = msgspec.Raw(msgspec.json.encode(fields[name])) if fields[name] is not None else msgspec.Raw()
    return EventArgs(**fields)


def _int_array(values: Sequence[Any], path: str, column: str) -> pa.Array:
    try:
        return pa.array(values, pa.int64())
    except (OverflowError, pa.ArrowInvalid) as exc:
        bad = next((v for v in values if isinstance(v, int) and not INT64_MIN <= v <= INT64_MAX), None)
        raise TraceFormatError(path, out_of_range(f"'{column}' value", bad)) from exc
    except (TypeError, pa.ArrowTypeError) as exc:
        raise TraceFormatError(path, f"non-integer value in '{column}' ({exc})") from exc


class OutOfRange(ValueError):
    """A time that int64 nanoseconds cannot hold; ``index`` is the first such event."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


def _microseconds_to_ns(values: Sequence[int | float | Decimal | None], base_ns: int,
                        exact: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Absolute int64 ns from Kineto's microseconds, and the null mask.

    Epoch microseconds (~1.7e15) times 1000 exceed float64's exact range, so the whole and the
    fractional microseconds are converted separately. Exact decimals (see ``ExactTimeEvent``)
    are converted exactly. Nulls become 0 in the values and True in the mask. A value whose ns
    (plus ``base_ns``) int64 cannot hold raises ``OutOfRange``: a float cast to int64 out of range
    gives 0 or wraps round, and either would be stored as if it were a time.
    """
    if exact:
        null = np.fromiter((v is None for v in values), bool, len(values))
        exact_ns = [0 if v is None else int((Decimal(v) * 1000).to_integral_value()) + base_ns for v in values]
        bad = next((i for i, v in enumerate(exact_ns) if not INT64_MIN <= v <= INT64_MAX), None)
        if bad is not None:
            raise OutOfRange(bad)
        return np.array(exact_ns, dtype=np.int64), null
    # np.array over a list comprehension: pa.array() on a list mixing ints and floats takes the
    # slow per-object path (0.9 s against 0.04 s for 216k values).
    try:
        us = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    except OverflowError:  # an integer beyond float64 (more than ~308 digits)
        raise OutOfRange(next(i for i, v in enumerate(values) if v is not None and abs(v) > 1e300)) from None
    null = np.isnan(us)
    # One microsecond of margin keeps the rounding below from crossing the limits.
    lowest, highest = (INT64_MIN - base_ns) / 1000 + 1, (INT64_MAX - base_ns) / 1000 - 1
    with np.errstate(invalid="ignore"):
        outside = ~null & ~((us >= lowest) & (us <= highest))
    if outside.any():
        raise OutOfRange(int(np.flatnonzero(outside)[0]))
    whole = np.floor(us)
    frac_ns = np.rint((us - whole) * 1000.0)
    with np.errstate(invalid="ignore"):
        out = np.where(null, 0, whole).astype(np.int64) * 1000
        out += np.where(null, 0, frac_ns).astype(np.int64)
    return out + base_ns, null


def _times(events: Sequence[Any], names: list[str], path: str, base_ns: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``ts_ns, ts_null, dur_ns, dur_null`` of every event, or a ``TraceFormatError`` naming the
    first event whose time is out of range or whose duration is negative."""
    def refused(column: str, index: int) -> TraceFormatError:
        value = getattr(events[index], column)
        return TraceFormatError(path, f"event {index} ({names[index]!r}): " + out_of_range(
            f"'{column}'", value, "nanoseconds, about +-292 years"))

    exact = bool(events) and isinstance(events[0], ExactTimeEvent)
    try:
        ts_ns, ts_null = _microseconds_to_ns([e.ts for e in events], base_ns, exact=exact)
    except OutOfRange as exc:
        raise refused("ts", exc.index) from None
    try:
        dur_ns, dur_null = _microseconds_to_ns([e.dur for e in events], 0)
    except OutOfRange as exc:
        raise refused("dur", exc.index) from None
    if (dur_ns[~dur_null] < 0).any():
        first = int(np.flatnonzero((dur_ns < 0) & ~dur_null)[0])
        raise TraceFormatError(path, f"event {first} ({names[first]!r}) has a negative duration")
    ends_beyond = ~ts_null & ~dur_null & (ts_ns > INT64_MAX - dur_ns)
    if ends_beyond.any():
        raise refused("dur", int(np.flatnonzero(ends_beyond)[0]))
    return ts_ns, ts_null, dur_ns, dur_null


def _member_mask(encoded: pa.DictionaryArray, members: frozenset[str]) -> np.ndarray:
    """Rows of a dictionary-encoded column whose value is in ``members``, from its indices:
    one vectorised test instead of a Python pass over every event."""
    codes = [i for i, value in enumerate(encoded.dictionary.to_pylist()) if value in members]
    return np.isin(encoded.indices.to_numpy(zero_copy_only=False), codes)


def _nullable(values: np.ndarray, mask: np.ndarray) -> pa.Array:
    return pa.array(values, pa.int64(), mask=mask)


def _dict(values: Sequence[str | None]) -> pa.Array:
    return pa.array(values, pa.string()).dictionary_encode()


def _split_ids(values: Sequence[int | str | None]) -> tuple[list[int | None], list[str | None]]:
    """Kineto pids/tids are integers, except a few named tracks (``"Spans"``, ``""``)."""
    ints = [v if isinstance(v, int) else None for v in values]
    labels = [v if isinstance(v, str) else None for v in values]
    return ints, labels


def _element_count(dims_raw: msgspec.Raw) -> int | None:
    """Elements in the first input of a host-side collective (a tensor or a tensor list).

    ``Input Dims`` of ``c10d::allreduce_`` is ``[[[n, m], [k]], [], ...]`` (a list of tensors)
    and of ``c10d::broadcast_`` on one tensor ``[[n, m], ...]``.
    """
    if not dims_raw:
        return None
    dims = msgspec.json.decode(dims_raw)
    if not isinstance(dims, list) or not dims:
        return None
    first = dims[0]
    if not isinstance(first, list) or not first:
        return None
    tensors = first if isinstance(first[0], list) else [first]
    total = 0
    for shape in tensors:
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            return None
        total += math.prod(shape)  # exact: an int64 product would wrap round silently
    return total


def _first_input_type(types_raw: msgspec.Raw) -> str | None:
    """Element type of the first input, when it is one (``c10d::allreduce_`` records only
    ``TensorList`` there: its dtype is unknown, not ``TensorList``)."""
    if not types_raw:
        return None
    types = msgspec.json.decode(types_raw)
    if isinstance(types, list) and types and isinstance(types[0], str) and dtype_bytes(types[0]):
        return types[0]
    return None


def _collective_columns(
    names: list[str], categories: list[str | None], args: list[EventArgs]
) -> dict[str, list[Any]]:
    """Typed collective fields for communication events; nulls elsewhere.

    Kernels and ``record_param_comms`` carry ``Collective name`` and message sizes in newer
    traces; CPU-side collectives under gloo carry only ``Input Dims``/``Input type``, from which
    the element count and dtype are derived.
    """
    n = len(names)
    collective: list[str | None] = [None] * n
    in_nelems: list[int | None] = [None] * n
    out_nelems: list[int | None] = [None] * n
    dtype: list[str | None] = [None] * n
    nbytes: list[int | None] = [None] * n
    for i in (i for i, c in enumerate(categories) if c == "communication"):
        a = args[i]
        collective[i] = normalise_collective(a.collective or names[i])
        nin, nout, dt = a.in_nelems, a.out_nelems, a.dtype
        if nin is None and nout is None:
            nin = _element_count(a.input_dims)
            nout = nin
            dt = dt or _first_input_type(a.input_type)
        in_nelems[i], out_nelems[i] = nin, nout
        dtype[i] = dt.removeprefix("c10::") if dt else None
        size = dtype_bytes(dt)
        largest = max((v for v in (nin, nout) if v is not None), default=None)
        if size is not None and largest is not None:
            nbytes[i] = largest * size
    return {"collective": collective, "in_nelems": in_nelems, "out_nelems": out_nelems,
            "dtype": dtype, "bytes": nbytes}


def _args_column(raws: list[msgspec.Raw]) -> pa.Array:
    """Each event's ``args`` JSON text as recorded, null where the event has none.

    Built from one joined buffer plus offsets rather than one bytes object per event: on
    df_index_resolver (216k events, 17 MB of args) convert takes ~20-60 ms less CPU (peak RSS
    is unchanged: it is reached later). The cast to string still validates UTF-8.
    """
    lengths = np.fromiter(map(len, raws), np.int64, len(raws))
    offsets = np.zeros(len(raws) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:  # beyond 32-bit offsets: let pyarrow chunk it
        return pa.array([bytes(r) or None for r in raws], pa.binary()).cast(pa.string())
    buffers = [pa.py_buffer(np.packbits(lengths > 0, bitorder="little")),
               pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(raws))]
    return pa.Array.from_buffers(pa.binary(), len(raws), buffers).cast(pa.string())


def _pg_ranks(value: str | list[int] | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return msgspec.json.encode(value).decode()


def _steps(kinds: list[str], names: list[str], ts_ns: np.ndarray, dur_ns: np.ndarray,
           dur_null: np.ndarray, phs: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """ProfilerStep windows: (step, start, end, name) sorted by start, one per step number."""
    windows: dict[int, list[int]] = {}
    for i, name in enumerate(names):
        if phs[i] != "X" or kinds[i] not in STEP_KINDS or dur_null[i]:
            continue
        match = STEP_NAME.match(name)
        if match is None:
            continue
        step = int(match.group(1))
        start, end = int(ts_ns[i]), int(ts_ns[i] + dur_ns[i])
        window = windows.setdefault(step, [start, end])
        window[0], window[1] = min(window[0], start), max(window[1], end)
    ordered = sorted(windows.items(), key=lambda item: item[1][0])
    steps = np.array([s for s, _ in ordered], dtype=np.int64)
    starts = np.array([w[0] for _, w in ordered], dtype=np.int64)
    ends = np.array([w[1] for _, w in ordered], dtype=np.int64)
    return steps, starts, ends, [f"ProfilerStep#{s}" for s in steps]


def _step_of_time(ts_ns: np.ndarray, steps: np.ndarray, starts: np.ndarray, ends: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Step whose CPU window holds each timestamp: (step values, null mask)."""
    if len(steps) == 0:
        return np.zeros(len(ts_ns), np.int64), np.ones(len(ts_ns), bool)
    idx = np.searchsorted(starts, ts_ns, side="right") - 1
    safe = np.clip(idx, 0, len(steps) - 1)
    inside = (idx >= 0) & (ts_ns < ends[safe])
    return steps[safe], ~inside


def _assign_steps(gpu: np.ndarray, launch: np.ndarray, correlation: list[int | None], ts_ns: np.ndarray,
                  steps: np.ndarray, starts: np.ndarray, ends: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Step of every event. GPU work inherits the step of the runtime call that launched it.

    A kernel launched in step N that runs after step N's CPU window ended still belongs to N.
    GPU work without a matching launch (none recorded) falls back to its own start time.
    ``gpu`` and ``launch`` mark GPU-side events and runtime/driver calls.
    """
    step, null = _step_of_time(ts_ns, steps, starts, ends)
    if len(steps) == 0:
        return step, null
    corr = np.array([c if c is not None else -1 for c in correlation], dtype=np.int64)
    launch_idx = np.flatnonzero(launch & (corr >= 0))
    if not gpu.any() or len(launch_idx) == 0:
        return step, null
    order = np.argsort(corr[launch_idx], kind="stable")
    launch_corr = corr[launch_idx][order]
    launch_rows = launch_idx[order]
    gpu_idx = np.flatnonzero(gpu & (corr >= 0))
    pos = np.searchsorted(launch_corr, corr[gpu_idx])
    pos_safe = np.clip(pos, 0, len(launch_corr) - 1)
    found = launch_corr[pos_safe] == corr[gpu_idx]
    targets = gpu_idx[found]
    sources = launch_rows[pos_safe[found]]
    step[targets] = step[sources]
    null[targets] = null[sources]
    return step, null


def convert(trace: RawTrace, source: str, progress: Callable[[int], None] | None = None) -> TraceTables:
    """Build the events, steps and memory tables of one trace, all rows tagged with ``source``."""
    events = trace.events
    n = len(events)
    path = trace.path
    phs = [e.ph for e in events]
    names = [e.name if e.name is not None else "" for e in events]
    cats = [e.cat for e in events]
    kinds_categories = [classify(c, nm, ph) for c, nm, ph in zip(cats, names, phs)]
    kinds = [kc[0] for kc in kinds_categories]
    categories = [kc[1] for kc in kinds_categories]
    args = [_decode_args(path, e.args, i) for i, e in enumerate(events)]
    args_column = _args_column([e.args for e in events])
    for event in events:
        # Each Raw keeps the whole decompressed JSON text alive; dropping them frees it (~54 MB
        # on df_index_resolver) before the columns are built.
        event.args = _NO_ARGS
    if progress:
        progress(n // 2)

    ts_ns, ts_null, dur_ns, dur_null = _times(events, names, path, trace.base_time_ns)

    correlation = [a.correlation for a in args]
    step_ids, starts, ends, step_names = _steps(kinds, names, ts_ns, dur_ns, dur_null, phs)
    kind_column, ph_column = _dict(kinds), _dict(phs)
    step, step_null = _assign_steps(_member_mask(kind_column, GPU_SIDE_KINDS),
                                    _member_mask(kind_column, LAUNCH_KINDS),
                                    correlation, ts_ns, step_ids, starts, ends)
    step_null |= ts_null

    pid, pid_label = _split_ids([e.pid for e in events])
    tid, tid_label = _split_ids([e.tid for e in events])
    thread_label = [p if p is not None else t for p, t in zip(pid_label, tid_label)]
    flow_id = [e.id if isinstance(e.id, int) and k == "flow" else None for e, k in zip(events, kinds)]
    comm = _collective_columns(names, categories, args)
    nbytes = [
        comm["bytes"][i] if comm["bytes"][i] is not None
        else (a.signed_bytes if kinds[i] == "memory" else a.bytes)
        for i, a in enumerate(args)
    ]
    device = [a.device if a.device is not None else a.device_id for a in args]
    source_col = pa.array([source] * n, pa.string()).dictionary_encode()

    columns = {
        "source": source_col,
        "kind": kind_column,
        "category": _dict(categories),
        "name": pa.array(names, pa.string()),
        "ph": ph_column,
        "ts_ns": _nullable(ts_ns, ts_null),
        "dur_ns": _nullable(dur_ns, dur_null),
        "pid": _int_array(pid, path, "pid"),
        "tid": _int_array(tid, path, "tid"),
        "thread_label": pa.array(thread_label, pa.string()),
        "stream": _int_array([a.stream for a in args], path, "stream"),
        "device": _int_array(device, path, "device"),
        "correlation": _int_array(correlation, path, "correlation"),
        "external_id": _int_array([a.external_id for a in args], path, "External id"),
        "flow_id": _int_array(flow_id, path, "id"),
        "step": _nullable(step, step_null),
        "bytes": _int_array(nbytes, path, "bytes"),
        "collective": _dict(comm["collective"]),
        "in_nelems": _int_array(comm["in_nelems"], path, "In msg nelems"),
        "out_nelems": _int_array(comm["out_nelems"], path, "Out msg nelems"),
        "dtype": _dict(comm["dtype"]),
        "group_size": _int_array([a.group_size for a in args], path, "Group size"),
        "pg_name": _dict([a.pg_name for a in args]),
        "pg_desc": _dict([a.pg_desc for a in args]),
        "pg_ranks": _dict([_pg_ranks(a.pg_ranks) for a in args]),
        "comm_seq": _int_array([a.seq for a in args], path, "Seq"),
        "args": args_column,
    }
    events_table = pa.table(columns).cast(schema.EVENTS)
    events_table = events_table.take(pc.sort_indices(events_table, sort_keys=[("ts_ns", "ascending", "at_start")]))

    memory_mask = _member_mask(kind_column, frozenset({"memory"}))
    memory_table = _memory_table(args, memory_mask, ts_ns, step, step_null, source, path)
    steps_table = pa.table(
        {
            "source": pa.array([source] * len(step_ids), pa.string()).dictionary_encode(),
            "step": pa.array(step_ids, pa.int64()),
            "name": pa.array(step_names, pa.string()),
            "start_ns": pa.array(starts, pa.int64()),
            "end_ns": pa.array(ends, pa.int64()),
            "dur_ns": pa.array(ends - starts, pa.int64()),
        }
    ).cast(schema.STEPS)
    timed = ~ts_null & ~_member_mask(ph_column, frozenset({"M"}))
    start = int(ts_ns[timed].min()) if timed.any() else None
    end = int((ts_ns + np.where(dur_null, 0, dur_ns))[timed].max()) if timed.any() else None
    kernel_devices = [d for d, k in zip(device, kinds) if k == "kernel" and d is not None]
    main_device = max(set(kernel_devices), key=kernel_devices.count) if kernel_devices else None
    if progress:
        progress(n - n // 2)
    return TraceTables(events_table, steps_table, memory_table, start, end, main_device)


def _memory_table(args: list[EventArgs], mask: np.ndarray, ts_ns: np.ndarray,
                  step: np.ndarray, step_null: np.ndarray, source: str, path: str) -> pa.Table:
    rows = np.flatnonzero(mask)
    picked = [args[i] for i in rows]
    return pa.table(
        {
            "source": pa.array([source] * len(rows), pa.string()).dictionary_encode(),
            "ts_ns": pa.array(ts_ns[rows], pa.int64()),
            "step": pa.array(step[rows], pa.int64(), mask=step_null[rows]),
            "addr": _int_array([a.addr for a in picked], path, "Addr"),
            "bytes": _int_array([a.signed_bytes for a in picked], path, "Bytes"),
            "total_allocated": _int_array([a.total_allocated for a in picked], path, "Total Allocated"),
            "total_reserved": _int_array([a.total_reserved for a in picked], path, "Total Reserved"),
            "device_type": _int_array([a.device_type for a in picked], path, "Device Type"),
            "device": _int_array([a.device_id for a in picked], path, "Device Id"),
        }
    ).cast(schema.MEMORY).sort_by("ts_ns")
