"""Turn a trace's event pieces into the store's parts (events, steps, memory) with DuckDB SQL.

No Python runs per event. DuckDB reads every piece (``split.py``) with explicit columns: ``ts``
and ``dur`` as ``DECIMAL(38, 3)``, parsed from their JSON text, so fractional epoch microseconds
stay exact to the nanosecond; ``args`` as JSON. Every column is one SQL expression: the kind and
category rules are ``classify.py``'s table compiled to SQL, the typed ``args`` fields are
``json_extract``-ed, the step of every event is an ASOF join on the step windows plus a join on
the launch's correlation id. Rows gather in one DuckDB temporary table (``ev``: the raw columns,
kind, category, times and the few typed fields the steps need), which DuckDB spills to disk past
its memory limit; the parts are then ``COPY``-ed from it, in the file's order (which compresses
better than time order: 1.8 MB against 2.5 MB for df_index_resolver's events).

Refusals (one ``TraceFormatError``, ``<file>: <problem>``, nothing kept): a time or an integer
outside int64 ("out of range", never stored as 0 or wrapped round), a negative duration, ``args``
that are not an object, an event that is not an object. Integers are checked where SQL types
them: an integer beyond int64 stops the statement with a marked ``error()`` that ``_refusal``
turns into the store's one wording (``schema.out_of_range``).
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import msgspec

from stepscope.errors import WRITE_PROBLEMS, TraceFormatError
from stepscope.store.classify import (
    GPU_SIDE_KINDS,
    HOST_KINDS,
    LAUNCH_KINDS,
    STEP_KINDS,
    category_sql,
    collective_sql,
    dtype_bytes_sql,
    kind_sql,
)
from stepscope.store.kineto import KinetoTrace
from stepscope.store.schema import INT64_MAX, INT64_MIN, out_of_range

STEP_PREFIX = "ProfilerStep#"
"""``ProfilerStep#N``: a profiler step's window (its CPU annotation)."""

RAW_COLUMNS = ("{ph: 'VARCHAR', name: 'VARCHAR', cat: 'VARCHAR', ts: 'DECIMAL(38,3)', "
               "dur: 'DECIMAL(38,3)', pid: 'JSON', tid: 'JSON', id: 'JSON', args: 'JSON'}")
"""What DuckDB reads of each event (other keys are skipped). ``args`` stays JSON: every value as
``json.loads`` reads it, integers of any size and numbers beyond double's range digit for digit
(DuckDB rewrites only whitespace, escapes and the spelling of doubles)."""

US_LIMIT = 10**16
"""|microseconds| from which no time fits int64 ns (9.2e15 us); checked before multiplying, so
that the product stays inside ``DECIMAL(38, 3)``."""
MARGIN_NS = 1000
"""Times within 1 us of int64's ends are refused too (as before: no rounding may cross them)."""
BEYOND = "stepscope-beyond"
"""Marks the ``error()`` SQL raises for an integer beyond int64."""
_FIELD_SEP = "\x1f"


@dataclass(frozen=True)
class ArgField:
    """One ``args`` key typed into a column: ``kind`` is ``int`` (int64; beyond it refused),
    ``str`` or ``json`` (kept as JSON)."""

    column: str
    key: str
    kind: str = "int"


EVENT_FIELDS = (
    ArgField("stream", "stream"), ArgField("device_arg", "device"), ArgField("device_id", "Device Id"),
    ArgField("external_id", "External id"), ArgField("args_bytes", "bytes"), ArgField("signed_bytes", "Bytes"),
    ArgField("group_size", "Group size"), ArgField("comm_seq", "Seq"),
    ArgField("pg_name", "Process Group Name", "str"), ArgField("pg_desc", "Process Group Description", "str"),
    ArgField("pg_ranks", "Process Group Ranks", "json"),
)
"""``args`` keys of the ``events`` columns (``correlation`` is typed in ``ev``: the steps need it)."""
MEMORY_FIELDS = (
    ArgField("addr", "Addr"), ArgField("bytes", "Bytes"), ArgField("total_allocated", "Total Allocated"),
    ArgField("total_reserved", "Total Reserved"), ArgField("device_type", "Device Type"),
    ArgField("device", "Device Id"),
)
"""``args`` keys of the ``memory`` columns (``[memory]`` events)."""
COMM_FIELDS = (
    ArgField("in_arg", "In msg nelems"), ArgField("out_arg", "Out msg nelems"),
    ArgField("collective_arg", "Collective name", "str"), ArgField("dtype_arg", "dtype", "str"),
    ArgField("input_dims", "Input Dims", "json"), ArgField("input_type", "Input type", "json"),
)
"""``args`` keys of the collective columns (communication events)."""

_MACROS = rf"""
CREATE OR REPLACE TEMP MACRO beyond(what, j) AS
    error('{BEYOND}' || chr(31) || what || chr(31) || j::VARCHAR);
CREATE OR REPLACE TEMP MACRO json_int(j, what) AS
    CASE WHEN json_type(j) IN ('UBIGINT', 'BIGINT') THEN coalesce(TRY_CAST(j AS BIGINT), beyond(what, j))
         WHEN json_type(j) = 'DOUBLE' AND regexp_full_match(j::VARCHAR, '-?[0-9]+') THEN beyond(what, j) END;
CREATE OR REPLACE TEMP MACRO json_str(j) AS
    CASE WHEN json_type(j) = 'VARCHAR' THEN j ->> '$' END;
CREATE OR REPLACE TEMP MACRO shape_elements(shape) AS
    CASE WHEN json_type(shape) = 'ARRAY'
          AND list_bool_and(list_transform(from_json(shape, '["JSON"]'),
                                           lambda d: json_type(d) IN ('UBIGINT', 'BIGINT')))
    THEN CASE WHEN json_array_length(shape) = 0 THEN 1::HUGEINT
              WHEN list_sum(list_transform(from_json(shape, '["DOUBLE"]'),
                                           lambda d: log10(greatest(abs(d), 1)))) > 30
              THEN (10::HUGEINT) ** 30
              ELSE list_reduce(from_json(shape, '["HUGEINT"]'), lambda a, b: a * b) END
    END;
CREATE OR REPLACE TEMP MACRO first_input_elements(dims) AS
    CASE WHEN json_type(dims) = 'ARRAY' AND json_array_length(dims) > 0
          AND json_type(dims, '$[0]') = 'ARRAY' AND json_array_length(dims, '$[0]') > 0
    THEN CASE WHEN json_type(dims, '$[0][0]') = 'ARRAY'
              THEN list_sum(list_transform(from_json(json_extract(dims, '$[0]'), '["JSON"]'),
                                           lambda s: shape_elements(s)))
              ELSE shape_elements(json_extract(dims, '$[0]')) END
    END;
CREATE OR REPLACE TEMP MACRO checked_int(v, what) AS
    CASE WHEN v BETWEEN {INT64_MIN} AND {INT64_MAX} THEN v::BIGINT WHEN v IS NOT NULL THEN beyond(what, v) END;
"""
"""SQL helpers. ``json_int(j, what)``: a JSON integer that int64 holds; null for a float, a string
or a bool in an integer field (not recorded); an integer beyond int64 stops the statement
(``beyond``). ``first_input_elements``: elements of the first input in ``Input Dims`` (one tensor
``[n, m]`` or a tensor list ``[[n, m], [k]]``), exact in HUGEINT (a product past 10^30 is
clamped there, and refused by ``checked_int`` all the same)."""


def _sql_set(values: frozenset[str]) -> str:
    return "(" + ", ".join(f"'{v}'" for v in sorted(values)) + ")"


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _typed(fields: tuple[ArgField, ...], args: str = "args") -> tuple[str, dict[str, str]]:
    """One ``json_extract`` of all ``fields`` (column ``x``) and each field's SQL over it."""
    paths = ", ".join(_sql_string(f'$."{f.key}"') for f in fields)
    exprs = {}
    for j, f in enumerate(fields, start=1):
        value = f"x[{j}]"
        exprs[f.column] = {"int": f"json_int({value}, {_sql_string(f.key)})",
                           "str": f"json_str({value})", "json": value}[f.kind]
    return f"json_extract({args}, [{paths}]) AS x", exprs


def _events_table(pieces: list[Path]) -> str:
    """The SQL that reads every piece (in the file's order) into the temporary table ``ev``."""
    files = "[" + ", ".join(_sql_string(str(p)) for p in pieces) + "]"
    return f"""
    CREATE OR REPLACE TEMP TABLE ev AS
    SELECT kind, category, name, ph, ts_rel, dur_ns, ts_beyond, dur_beyond,
           json_int(pid, 'pid') AS pid, json_int(tid, 'tid') AS tid,
           coalesce(json_str(pid), json_str(tid)) AS thread_label,
           CASE WHEN kind = 'flow' THEN json_int(id, 'id') END AS flow_id,
           json_int(json_extract(args, '$.correlation'), 'correlation') AS correlation,
           CASE WHEN kind IN {_sql_set(STEP_KINDS)} AND ph = 'X' AND dur_ns IS NOT NULL
                     AND starts_with(name, '{STEP_PREFIX}') AND regexp_full_match(name, '{STEP_PREFIX}[0-9]+')
                THEN TRY_CAST(name[{len(STEP_PREFIX) + 1}:] AS BIGINT) END AS step_no,
           args IS NOT NULL AND json_type(args) <> 'OBJECT' AS args_not_object,
           args
    FROM (
        SELECT *, {category_sql("kind", "cat", "name")} AS category
        FROM (
            SELECT {kind_sql("cat", "name", "ph")} AS kind, cat, name, ph, ts_rel, dur_ns,
                   CASE WHEN ts IS NOT NULL AND ts_rel IS NULL THEN ts::VARCHAR END AS ts_beyond,
                   CASE WHEN dur IS NOT NULL AND dur_ns IS NULL THEN dur::VARCHAR END AS dur_beyond,
                   pid, tid, id, args
            FROM (SELECT * REPLACE (coalesce(name, '') AS name, coalesce(ph, '') AS ph),
                         CASE WHEN abs(ts) < {US_LIMIT} THEN TRY_CAST(ts * 1000 AS BIGINT) END AS ts_rel,
                         CASE WHEN abs(dur) < {US_LIMIT} THEN TRY_CAST(dur * 1000 AS BIGINT) END AS dur_ns
                  FROM read_json({files}, format = 'array', columns = {RAW_COLUMNS}))
        )
    )
    """


def _comm_table() -> str:
    """Collective fields of communication events: ``In/Out msg nelems`` and ``dtype`` as
    recorded, or (gloo and other CPU-side collectives) the element count and type of the first
    input; the nccl-tests message size ``max(in, out) x element size``; the normalised collective."""
    extract, f = _typed(COMM_FIELDS)
    first_type = "(input_type ->> '$[0]')"
    return f"""
    CREATE OR REPLACE TEMP TABLE comm AS
    WITH recorded AS (
        SELECT i, name, {f["in_arg"]} AS in_arg, {f["out_arg"]} AS out_arg,
               {f["collective_arg"]} AS collective_arg, {f["dtype_arg"]} AS dtype_arg,
               {f["input_dims"]} AS input_dims, {f["input_type"]} AS input_type
        FROM (SELECT rowid AS i, name, {extract} FROM ev WHERE category = 'communication')
    ), sized AS (
        SELECT i, name, collective_arg,
               CASE WHEN in_arg IS NULL AND out_arg IS NULL THEN first_input_elements(input_dims)
                    ELSE in_arg END AS in_n,
               CASE WHEN in_arg IS NULL AND out_arg IS NULL THEN first_input_elements(input_dims)
                    ELSE out_arg END AS out_n,
               CASE WHEN in_arg IS NULL AND out_arg IS NULL
                    THEN coalesce(nullif(dtype_arg, ''),
                                  CASE WHEN json_type(input_type, '$[0]') = 'VARCHAR'
                                            AND {dtype_bytes_sql(first_type)} IS NOT NULL THEN {first_type} END)
                    ELSE dtype_arg END AS dtype
        FROM recorded
    )
    SELECT i, checked_int(in_n, 'In msg nelems') AS in_nelems, checked_int(out_n, 'Out msg nelems') AS out_nelems,
           nullif(regexp_replace(dtype, '^c10::', ''), '') AS dtype,
           {collective_sql("coalesce(nullif(collective_arg, ''), name)")} AS collective,
           checked_int(greatest(in_n, out_n) * {dtype_bytes_sql("dtype")}, 'bytes') AS nbytes
    FROM sized
    """


def _events_part() -> str:
    extract, f = _typed(EVENT_FIELDS)
    return f"""
    SELECT $source AS source, e.kind, e.category, e.name, e.ph, e.ts_rel + $base AS ts_ns, e.dur_ns,
           e.pid, e.tid, e.thread_label, {f["stream"]} AS stream,
           coalesce({f["device_arg"]}, {f["device_id"]}) AS device, e.correlation,
           {f["external_id"]} AS external_id, e.flow_id, s.step,
           CASE WHEN c.nbytes IS NOT NULL THEN c.nbytes
                WHEN e.kind = 'memory' THEN {f["signed_bytes"]} ELSE {f["args_bytes"]} END AS bytes,
           c.collective, c.in_nelems, c.out_nelems, c.dtype, {f["group_size"]} AS group_size,
           {f["pg_name"]} AS pg_name, {f["pg_desc"]} AS pg_desc,
           CASE WHEN json_type({f["pg_ranks"]}) = 'VARCHAR' THEN {f["pg_ranks"]} ->> '$'
                WHEN json_type({f["pg_ranks"]}) = 'ARRAY' THEN {f["pg_ranks"]}::VARCHAR END AS pg_ranks,
           {f["comm_seq"]} AS comm_seq, e.args::VARCHAR AS args
    FROM (SELECT rowid AS i, *, {extract} FROM ev) e
    LEFT JOIN event_step s ON s.i = e.i LEFT JOIN comm c ON c.i = e.i
    """


def _memory_part() -> str:
    extract, f = _typed(MEMORY_FIELDS)
    columns = ", ".join(f"{f[field.column]} AS {field.column}" for field in MEMORY_FIELDS)
    return f"""
    SELECT $source AS source, e.ts_rel + $base AS ts_ns, s.step, {columns}
    FROM (SELECT rowid AS i, ts_rel, {extract} FROM ev WHERE kind = 'memory' AND ts_rel IS NOT NULL) e
    LEFT JOIN event_step s ON s.i = e.i
    ORDER BY e.ts_rel, e.i
    """


_STEPS_PART = """
SELECT $source AS source, step, 'ProfilerStep#' || step AS name, start_ns, end_ns, end_ns - start_ns AS dur_ns
FROM steps ORDER BY start_ns, step
"""


@dataclass(frozen=True)
class Conversion:
    """Facts about a converted trace for its ``sources`` row and the store's rules."""

    event_count: int
    start_ns: int | None
    end_ns: int | None
    main_device: int | None
    main_pid: int | None
    """The process id most host-side events carry (one recording is one process)."""
    steps: tuple[int, ...]
    """The ``ProfilerStep`` numbers the trace holds."""


def _refusal(path: Path, exc: duckdb.Error) -> BaseException:
    """The ``TraceFormatError`` a marked SQL ``error()`` stands for; a full disk or an unwritable
    store as the ``OSError`` it is; else ``exc`` itself."""
    message = str(exc)
    if BEYOND in message:
        _, what, value = message[message.index(BEYOND):].split(_FIELD_SEP, 2)
        return TraceFormatError(path, out_of_range(f"'{what}' value", value.strip()))
    if isinstance(exc, duckdb.IOException):
        code = next((c for c in WRITE_PROBLEMS if os.strerror(c) in message), errno.EIO)
        return OSError(code, message)
    return exc


class SqlPart:
    """A part written by DuckDB: ``COPY (query) TO path`` with the store's Parquet settings."""

    def __init__(self, con: duckdb.DuckDBPyConnection, path: Path, query: str, params: dict[str, Any]) -> None:
        self.con = con
        self.path = path
        self.query = query
        self.params = params

    def write_parquet(self, target: Path, metadata: dict[bytes, bytes]) -> None:
        kv = ", ".join(f"{_sql_string(k.decode())}: {_sql_string(v.decode())}" for k, v in metadata.items())
        try:
            self.con.execute(
                f"COPY ({self.query}) TO {_sql_string(str(target))} (FORMAT parquet, COMPRESSION zstd, "
                f"ROW_GROUP_SIZE 262144, PARQUET_VERSION V2, KV_METADATA {{{kv}}})", self.params)
        except duckdb.Error as exc:
            raise _refusal(self.path, exc) from None


class Converted:
    """One trace's events, read and checked in DuckDB (temporary tables of ``con``), its facts,
    and the queries that write its parts (``parts``)."""

    def __init__(self, trace: KinetoTrace, con: duckdb.DuckDBPyConnection) -> None:
        self.path = Path(trace.path)
        self.con = con
        self.base_ns = trace.base_time_ns
        con.execute(_MACROS)
        try:
            con.execute(_events_table(trace.pieces))
        except duckdb.Error as exc:
            raise self._read_error(trace.pieces, exc) from None
        self._check_times()
        try:
            con.execute(_comm_table())
        except duckdb.Error as exc:
            raise _refusal(self.path, exc) from None
        self.conversion = self._steps_and_facts()

    def _read_error(self, pieces: list[Path], exc: duckdb.Error) -> BaseException:
        """Why DuckDB could not read the pieces: a time beyond any decimal, a malformed event,
        an integer beyond int64."""
        message = " ".join(str(exc).split())
        found = re.search(r'in file "([^"]*)", in record/value (\d+): (.*?)( Try setting|$)', message)
        if found is None:
            return _refusal(self.path, exc)
        piece = Path(found.group(1))
        index = int(found.group(2)) - 1
        number = index + sum(_count_events(p) for p in pieces[:pieces.index(piece)] if piece in pieces)
        event = _event_in_piece(piece, index)
        if "Failed to cast value to decimal" in found.group(3) and isinstance(event, dict):
            for column in ("ts", "dur"):
                value = event.get(column)
                if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) >= US_LIMIT:
                    return _time_refused(self.path, number, event.get("name"), column, value)
        return TraceFormatError(self.path, f"malformed event (event {number}: {found.group(3).strip()})")

    def _check_times(self) -> None:
        """Refuse the trace at the first event whose time the store cannot hold, or whose
        duration is negative, or whose args are not an object (checks in this order)."""
        lowest = INT64_MIN + MARGIN_NS - self.base_ns
        highest = INT64_MAX - MARGIN_NS - self.base_ns
        checks = {
            "ts": f"ts_beyond IS NOT NULL OR ts_rel < {lowest} OR ts_rel > {highest}",
            "dur": "dur_beyond IS NOT NULL",
            "negative": "dur_ns < 0",
            "end": f"CASE WHEN dur_ns >= 0 THEN ts_rel > {INT64_MAX - self.base_ns} - dur_ns END",
            "args": "args_not_object",
        }
        select = ", ".join(f"min(rowid) FILTER ({condition})" for condition in checks.values())
        first = self.con.execute(f"SELECT {select} FROM ev").fetchone()
        for check, index in zip(checks, first):
            if index is not None:
                raise self._time_refusal(check, index)

    def _time_refusal(self, check: str, index: int) -> TraceFormatError:
        name, ts_rel, dur_ns, ts_beyond, dur_beyond = self.con.execute(
            "SELECT name, ts_rel, dur_ns, ts_beyond, dur_beyond FROM ev WHERE rowid = ?", [index]).fetchone()
        if check == "negative":
            return TraceFormatError(self.path, f"event {index} ({name!r}) has a negative duration")
        if check == "args":
            return TraceFormatError(self.path, f"event {index}: args is not an object")
        column = "ts" if check == "ts" else "dur"
        text = ts_beyond if column == "ts" else dur_beyond
        ns = ts_rel if column == "ts" else dur_ns
        value = _decimal_text(text) if text is not None else _decimal_text(f"{ns / 1000:.3f}")
        return _time_refused(self.path, index, name, column, value)

    def _steps_and_facts(self) -> Conversion:
        """The steps, the step of every event, and the trace's facts."""
        con = self.con
        params = {"base": self.base_ns}
        con.execute("""
            CREATE OR REPLACE TEMP TABLE steps AS
            SELECT step_no AS step, min(ts_rel) + $base AS start_ns, max(ts_rel + dur_ns) + $base AS end_ns
            FROM ev WHERE step_no IS NOT NULL AND ts_rel IS NOT NULL GROUP BY step_no
        """, params)
        # The step of every event: the window holding its start; GPU work inherits the step of the
        # runtime call that launched it (same correlation id; the first such call in the file),
        # so a kernel that runs after its step's CPU window still counts for that step.
        con.execute("""
            CREATE OR REPLACE TEMP TABLE own_step AS
            SELECT e.i, e.kind, e.correlation, CASE WHEN e.ts_ns < s.end_ns THEN s.step END AS step
            FROM (SELECT rowid AS i, kind, correlation, ts_rel + $base AS ts_ns FROM ev WHERE ts_rel IS NOT NULL) e
            ASOF LEFT JOIN steps s ON e.ts_ns >= s.start_ns
        """, params)
        con.execute(f"""
            CREATE OR REPLACE TEMP TABLE event_step AS
            WITH launch AS (
                SELECT correlation, arg_min(step, i) AS step FROM own_step
                WHERE kind IN {_sql_set(LAUNCH_KINDS)} AND correlation IS NOT NULL GROUP BY correlation)
            SELECT o.i, CASE WHEN l.correlation IS NOT NULL THEN l.step ELSE o.step END AS step
            FROM own_step o LEFT JOIN launch l
              ON o.correlation = l.correlation AND o.kind IN {_sql_set(GPU_SIDE_KINDS)}
        """)
        count, start, end = con.execute("""
            SELECT count(*), min(ts_rel) FILTER (ph <> 'M') + $base,
                   max(ts_rel + coalesce(dur_ns, 0)) FILTER (ph <> 'M') + $base
            FROM ev
        """, params).fetchone()
        device = con.execute(f"""
            SELECT device FROM (
                SELECT coalesce(json_int(x[1], 'device'), json_int(x[2], 'Device Id')) AS device
                FROM (SELECT json_extract(args, ['$.device', '$."Device Id"']) AS x FROM ev WHERE kind = 'kernel'))
            WHERE device IS NOT NULL GROUP BY device ORDER BY count(*) DESC, device LIMIT 1
        """).fetchone()
        pid = con.execute(
            f"SELECT pid FROM ev WHERE pid IS NOT NULL AND kind IN {_sql_set(HOST_KINDS)} "
            "GROUP BY pid ORDER BY count(*) DESC, pid LIMIT 1").fetchone()
        steps = tuple(s for (s,) in con.execute("SELECT step FROM steps ORDER BY step").fetchall())
        return Conversion(count, start, end, device[0] if device else None, pid[0] if pid else None, steps)

    def parts(self, source: str) -> dict[str, SqlPart]:
        """The parts this trace writes (events, steps, memory), as queries over its tables."""
        params = {"source": source, "base": self.base_ns}
        return {"events": SqlPart(self.con, self.path, _events_part(), params),
                "steps": SqlPart(self.con, self.path, _STEPS_PART, {"source": source}),
                "memory": SqlPart(self.con, self.path, _memory_part(), params)}


def convert(trace: KinetoTrace, con: duckdb.DuckDBPyConnection) -> Converted:
    """Read, type and check a trace's events in ``con``. Raises ``TraceFormatError``."""
    return Converted(trace, con)


def _count_events(piece: Path) -> int:
    """Events in one piece (only to number the event a refusal names)."""
    try:
        return len(msgspec.json.decode(piece.read_bytes(), type=list[msgspec.Raw]))
    except (msgspec.DecodeError, OSError, RecursionError):
        return 0


def _event_in_piece(piece: Path, index: int) -> Any:
    """Event ``index`` of a piece, decoded (only to word a refusal)."""
    try:
        return msgspec.json.decode(piece.read_bytes())[index]
    except (msgspec.DecodeError, IndexError, OSError, RecursionError):
        return None


def _decimal_text(text: str) -> str:
    """A decimal without its trailing zeros: ``9300000000000000.500`` -> ``9300000000000000.5``."""
    if "." not in text or "e" in text.lower():
        return text
    return text.rstrip("0").rstrip(".")


def _time_refused(path: Path, index: int, name: Any, column: str, value: Any) -> TraceFormatError:
    return TraceFormatError(path, f"event {index} ({name!r}): " + out_of_range(
        f"'{column}'", value, "nanoseconds, about +-292 years"))
