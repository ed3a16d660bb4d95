"""Turn a trace's event pieces into the store's parts (events, steps, memory) with DuckDB SQL.

No Python runs per event, and no table in memory holds every event: the memory one conversion
needs does not grow with the trace (a trace 5x df_index_resolver's converts in ~1.1x its
memory). Three statements carry the events:

1. one ``COPY`` reads every piece that ``split.py`` wrote, types every column (one SQL
   expression each) and streams the rows, in the file's order, into a staging Parquet file in the
   work folder (on disk, not in memory); a trace of one piece (a small trace: its events are
   under ``split.PIECE_BYTES`` of JSON) is typed into a temporary table instead, never touching
   a staging file;
2. narrow scans of that file find the steps, check every time, and keep the small tables the
   last copy needs: the steps, a step lookup by time bucket, each launch's step;
3. one ``COPY`` of the staging file into the events part, the step of every event looked up in
   those tables (the window holding its start; GPU work: the step of the runtime call that
   launched it, joined on the correlation id), in the file's order (which compresses better
   than time order: 1.3 MB against 1.8 MB for df_index_resolver's events).

``ts`` and ``dur`` are read as ``DECIMAL(38, 3)``, parsed from their JSON text, so fractional
epoch microseconds stay exact to the nanosecond; ``args`` as JSON. The kind and category rules
are ``classify.py``'s table compiled to SQL.

Refusals (one ``TraceFormatError``, ``<file>: <problem>``, nothing kept): a time or an integer
outside int64 ("out of range", never stored as 0 or wrapped round), a negative duration, ``args``
that are not an object, an event that is not an object. Integers are checked where SQL types
them: one beyond int64 stops the statement with a marked ``error()`` that ``_refusal`` turns into
the store's one wording (``constants.out_of_range``).
"""

from __future__ import annotations

import errno
import os
import queue
import re
import threading
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
from stepscope.store.constants import INT64_MAX, INT64_MIN, out_of_range

STEP_PREFIX = "ProfilerStep#"
"""``ProfilerStep#N``: a profiler step's window (its CPU annotation)."""

RAW_COLUMNS = ("{ph: 'VARCHAR', name: 'VARCHAR', cat: 'VARCHAR', ts: 'DECIMAL(38,3)', "
               "dur: 'DECIMAL(38,3)', pid: 'JSON', tid: 'JSON', id: 'JSON', args: 'JSON'}")
"""What DuckDB reads of each event (other keys are skipped). ``args`` stays JSON: every value as
``json.loads`` reads it, integers of any size and numbers beyond double's range digit for digit
(DuckDB rewrites only whitespace, escapes and the spelling of doubles)."""

US_LIMIT = 10**16
"""|microseconds| from which no time fits int64 ns (9.2e15 us): such a value, beyond even the
decimal DuckDB reads it into, is refused as out of range from the read error it causes."""
MARGIN_NS = 1000
"""Times within 1 us of int64's ends are refused too (as before: no rounding may cross them)."""
STAGE_SUFFIX = ".staged.parquet"
"""A piece's staging file (beside it, in the work folder), which replaces it once written."""
STEP_BUCKETS = 4096
"""Time buckets of the step lookup: each holds the few steps a time in it can fall in."""
BEYOND = "stepscope-beyond"
"""Marks the ``error()`` SQL raises for an integer beyond int64."""
_FIELD_SEP = "\x1f"


@dataclass(frozen=True)
class ArgField:
    """One ``args`` key typed into a column: ``kind`` is ``int`` (int64; beyond it refused),
    ``str`` or ``json`` (kept as JSON); ``rows`` is the SQL condition of the rows that need it
    (None: every row)."""

    column: str
    key: str
    kind: str = "int"
    rows: str | None = None


_GROUP_KEYS = "(contains(args, '\"Group size\"') OR contains(args, '\"Seq\"') OR contains(args, '\"Process Group '))"
"""Rows that may hold the process-group keys (a few collectives): the text test spares every other
row a JSON parse."""

ARG_FIELDS: tuple[ArgField, ...] = (
    ArgField("correlation", "correlation"), ArgField("stream", "stream"), ArgField("device_arg", "device"),
    ArgField("device_id", "Device Id"), ArgField("external_id", "External id"), ArgField("args_bytes", "bytes"),
    ArgField("signed_bytes", "Bytes"),
    ArgField("group_size", "Group size", rows=_GROUP_KEYS), ArgField("comm_seq", "Seq", rows=_GROUP_KEYS),
    ArgField("pg_name", "Process Group Name", "str", _GROUP_KEYS),
    ArgField("pg_desc", "Process Group Description", "str", _GROUP_KEYS),
    ArgField("pg_ranks", "Process Group Ranks", "json", _GROUP_KEYS),
    ArgField("addr", "Addr", rows="kind = 'memory'"),
    ArgField("total_allocated", "Total Allocated", rows="kind = 'memory'"),
    ArgField("total_reserved", "Total Reserved", rows="kind = 'memory'"),
    ArgField("device_type", "Device Type", rows="kind = 'memory'"),
    ArgField("in_arg", "In msg nelems", rows="category = 'communication'"),
    ArgField("out_arg", "Out msg nelems", rows="category = 'communication'"),
    ArgField("collective_arg", "Collective name", "str", "category = 'communication'"),
    ArgField("dtype_arg", "dtype", "str", "category = 'communication'"),
    ArgField("input_dims", "Input Dims", "json", "category = 'communication'"),
    ArgField("input_type", "Input type", "json", "category = 'communication'"),
)
"""Every typed ``args`` key, with the rows that need it (one ``json_extract`` per row group)."""

_MACROS = rf"""
CREATE OR REPLACE TEMP MACRO beyond(what, j) AS
    error('{BEYOND}' || chr(31) || what || chr(31) || j::VARCHAR);
CREATE OR REPLACE TEMP MACRO json_int(j, what) AS
    CASE WHEN j IS NULL THEN NULL
         WHEN json_type(j) IN ('UBIGINT', 'BIGINT') THEN coalesce(TRY_CAST(j AS BIGINT), beyond(what, j))
         WHEN json_type(j) = 'DOUBLE' AND regexp_full_match(j::VARCHAR, '-?[0-9]+') THEN beyond(what, j) END;
CREATE OR REPLACE TEMP MACRO json_str(j) AS
    CASE WHEN j IS NULL THEN NULL WHEN json_type(j) = 'VARCHAR' THEN j ->> '$' END;
CREATE OR REPLACE TEMP MACRO checked_int(v, what) AS
    CASE WHEN v BETWEEN {INT64_MIN} AND {INT64_MAX} THEN v::BIGINT WHEN v IS NOT NULL THEN beyond(what, v) END;
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
CREATE OR REPLACE TEMP MACRO step_in(cands, t) AS
    CASE WHEN t < list_filter(cands, lambda c: c.s <= t)[-1].e THEN list_filter(cands, lambda c: c.s <= t)[-1].n END;
"""
"""SQL helpers. ``json_int(j, what)``: a JSON integer that int64 holds; null for a float, a string
or a bool in an integer field (not recorded); an integer beyond int64 stops the statement
(``beyond``). ``first_input_elements``: elements of the first input in ``Input Dims`` (one tensor
``[n, m]`` or a tensor list ``[[n, m], [k]]``), exact in HUGEINT (a product past 10^30 is
clamped there, and refused by ``checked_int`` all the same). ``step_in(cands, t)``: among the
step windows ``cands`` (sorted by start), the one that starts last at or before ``t``, if ``t``
is before its end."""


def _sql_set(values: frozenset[str]) -> str:
    return "(" + ", ".join(f"'{v}'" for v in sorted(values)) + ")"


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _typed_args() -> tuple[str, str]:
    """The ``json_extract`` of each row group of ``ARG_FIELDS`` and the typed columns over them."""
    groups: dict[str | None, list[ArgField]] = {}
    for f in ARG_FIELDS:
        groups.setdefault(f.rows, []).append(f)
    extracts, typed = [], []
    for k, (rows, members) in enumerate(groups.items()):
        paths = ", ".join(_sql_string(f'$."{f.key}"') for f in members)
        extract = f"json_extract(args, [{paths}])"
        extracts.append(f"CASE WHEN {rows} THEN {extract} END AS x{k}" if rows else f"{extract} AS x{k}")
        for j, f in enumerate(members, start=1):
            value = f"x{k}[{j}]"
            typed.append({"int": f"json_int({value}, {_sql_string(f.key)})", "str": f"json_str({value})",
                          "json": value}[f.kind] + f" AS {f.column}")
    return ", ".join(extracts), ", ".join(typed)


def _stage_query(piece: Path) -> str:
    """Every event of one piece, in the file's order, numbered from ``$first`` (``i``), each
    column typed (``ts_rel`` is in ns relative to ``baseTimeNanoseconds``; ``ts_beyond``/
    ``dur_beyond`` hold the text of times no int64 ns holds)."""
    extracts, typed = _typed_args()
    groups = ", ".join(f"x{k}" for k in range(extracts.count(" AS x")))
    return f"""
    SELECT $first + row_number() OVER () - 1 AS i, * EXCLUDE ({groups}, pid_json, tid_json, id_json), {typed} FROM (
        SELECT *, json_int(pid_json, 'pid') AS pid, json_int(tid_json, 'tid') AS tid,
               coalesce(json_str(pid_json), json_str(tid_json)) AS thread_label,
               CASE WHEN kind = 'flow' THEN json_int(id_json, 'id') END AS flow_id,
               CASE WHEN kind IN {_sql_set(STEP_KINDS)} AND ph = 'X' AND dur_ns IS NOT NULL
                         AND starts_with(name, '{STEP_PREFIX}') AND regexp_full_match(name, '{STEP_PREFIX}[0-9]+')
                    THEN TRY_CAST(name[{len(STEP_PREFIX) + 1}:] AS BIGINT) END AS step_no,
               args IS NOT NULL AND NOT starts_with(args, '{{') AS args_not_object,
               {extracts}
        FROM (
            SELECT *, {category_sql("kind", "cat", "name")} AS category FROM (
                SELECT {kind_sql("cat", "name", "ph")} AS kind, name, ph, ts_rel, dur_ns,
                       CASE WHEN ts IS NOT NULL AND ts_rel IS NULL THEN ts::VARCHAR END AS ts_beyond,
                       CASE WHEN dur IS NOT NULL AND dur_ns IS NULL THEN dur::VARCHAR END AS dur_beyond,
                       pid AS pid_json, tid AS tid_json, id AS id_json, args, cat
                FROM (SELECT * REPLACE (coalesce(name, '') AS name, coalesce(ph, '') AS ph),
                             TRY(CAST(ts * 1000 AS BIGINT)) AS ts_rel, TRY(CAST(dur * 1000 AS BIGINT)) AS dur_ns
                      FROM read_json({_sql_string(str(piece))}, format = 'array', columns = {RAW_COLUMNS}))
            )
        )
    )
    """


_COMM_TABLE = f"""
CREATE OR REPLACE TEMP TABLE comm AS
WITH recorded AS (
    SELECT i, name, collective_arg, in_arg, out_arg, dtype_arg, input_dims,
           CASE WHEN json_type(input_type, '$[0]') = 'VARCHAR'
                     AND {dtype_bytes_sql("(input_type ->> '$[0]')")} IS NOT NULL
                THEN input_type ->> '$[0]' END AS first_input_type
    FROM ev WHERE category = 'communication'
), sized AS (
    SELECT i, name, collective_arg,
           CASE WHEN in_arg IS NULL AND out_arg IS NULL THEN first_input_elements(input_dims) ELSE in_arg END AS in_n,
           CASE WHEN in_arg IS NULL AND out_arg IS NULL THEN first_input_elements(input_dims) ELSE out_arg END AS out_n,
           CASE WHEN in_arg IS NULL AND out_arg IS NULL
                THEN coalesce(nullif(dtype_arg, ''), first_input_type) ELSE dtype_arg END AS dtype
    FROM recorded
)
SELECT i, checked_int(in_n, 'In msg nelems') AS in_nelems, checked_int(out_n, 'Out msg nelems') AS out_nelems,
       nullif(regexp_replace(dtype, '^c10::', ''), '') AS dtype,
       {collective_sql("coalesce(nullif(collective_arg, ''), name)")} AS collective,
       checked_int(greatest(in_n, out_n) * {dtype_bytes_sql("dtype")}, 'bytes') AS nbytes
FROM sized
"""
"""Collective fields of communication events: ``In/Out msg nelems`` and ``dtype`` as recorded, or
(gloo and other CPU-side collectives) the element count and type of the first input; the
nccl-tests message size ``max(in, out) x element size``; the normalised collective."""

_NO_COMM_TABLE = """
CREATE OR REPLACE TEMP TABLE comm AS
SELECT NULL::BIGINT AS i, NULL::BIGINT AS in_nelems, NULL::BIGINT AS out_nelems, NULL::VARCHAR AS dtype,
       NULL::VARCHAR AS collective, NULL::BIGINT AS nbytes
WHERE FALSE
"""
"""``comm`` of a trace without communication events: its columns, no rows. Planning
``_COMM_TABLE`` costs ~50 ms whatever the rows; this, a millisecond."""

_STEPS_PART = """
SELECT $source AS source, step, 'ProfilerStep#' || step AS name, start_ns, end_ns, end_ns - start_ns AS dur_ns
FROM step_windows ORDER BY start_ns, step
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
                f"ROW_GROUP_SIZE 16384, PARQUET_VERSION V2, KV_METADATA {{{kv}}})", self.params)
        except duckdb.Error as exc:
            raise _refusal(self.path, exc) from None


SMALL_STAGE = "staged_events"
"""The temporary table a trace of one piece is typed into (its only staging)."""


class Stager:
    """Stages each piece as ``split`` writes it: a DuckDB ``COPY`` in a thread of its own, so
    the next piece is cut (msgspec, in Python) while this one is typed (DuckDB, which releases
    the GIL). The piece is deleted once staged. ``add`` raises the first failure so that the
    split stops; ``close`` waits for the last piece.

    The first piece waits for the second: when the split ends without one, the trace is small
    and its piece is typed into a temporary table (``SMALL_STAGE``), in memory, not through a
    staging file."""

    def __init__(self, path: Path, con: duckdb.DuckDBPyConnection) -> None:
        self.path = Path(path)
        self.con = con
        self.stages: list[Path] = []
        self.in_memory = False
        self.count = 0
        self._failure: BaseException | None = None
        self._queue: queue.Queue[Path | None] = queue.Queue(maxsize=2)
        con.execute(_MACROS)
        self._worker = threading.Thread(target=self._run, name="stepscope-stager", daemon=True)
        self._worker.start()

    def add(self, piece: Path) -> None:
        if self._failure is not None:
            raise self._failure
        self._queue.put(piece)

    def close(self) -> str:
        """The staged events as a SQL relation (the staging files, in the file's order, or the
        small trace's table), once every piece is staged; raises the first failure."""
        self._queue.put(None)
        self._worker.join()
        if self._failure is not None:
            raise self._failure
        if self.in_memory:
            return SMALL_STAGE
        return "read_parquet([" + ", ".join(_sql_string(str(p)) for p in self.stages) + "])"

    def stop(self) -> None:
        """Stop at once (an interrupt): the running statement is interrupted, nothing raised."""
        self._failure = self._failure or InterruptedError("stopped")
        self.con.interrupt()
        self._queue.put(None)
        self._worker.join()

    def _run(self) -> None:
        held: Path | None = None  # the first piece, until a second shows the trace is not small
        while (piece := self._queue.get()) is not None:
            if self._failure is not None:
                continue
            try:
                if held is None and not self.stages:
                    held = piece
                    continue
                if held is not None:
                    held, first = None, held
                    self._stage(first)
                self._stage(piece)
            except BaseException as exc:  # noqa: BLE001 - handed to the splitting thread
                self._failure = exc
        if held is not None and self._failure is None:
            try:
                self._stage(held, in_memory=True)
            except BaseException as exc:  # noqa: BLE001 - as above
                self._failure = exc

    def _stage(self, piece: Path, *, in_memory: bool = False) -> None:
        stage = piece.with_name(piece.name + STAGE_SUFFIX)
        try:
            if in_memory:
                (rows,) = self.con.execute(f"CREATE OR REPLACE TEMP TABLE {SMALL_STAGE} AS {_stage_query(piece)}",
                                           {"first": self.count}).fetchone()
            else:
                (rows,) = self.con.execute(
                    f"COPY ({_stage_query(piece)}) TO {_sql_string(str(stage))} "
                    "(FORMAT parquet, COMPRESSION lz4, ROW_GROUP_SIZE 16384)", {"first": self.count}).fetchone()
        except duckdb.Error as exc:
            raise self._read_error(piece, exc) from None
        piece.unlink()
        if in_memory:
            self.in_memory = True
        else:
            self.stages.append(stage)
        self.count += rows

    def _read_error(self, piece: Path, exc: duckdb.Error) -> BaseException:
        """Why DuckDB could not read a piece: a time beyond any decimal, args or an event that is
        not an object, a malformed event, an integer beyond int64."""
        message = " ".join(str(exc).split())
        found = re.search(r'in record/value (\d+): (.*?)( Try setting|$)', message)
        if found is None:
            return _refusal(self.path, exc)
        index = int(found.group(1)) - 1
        number = self.count + index
        event = _event_in_piece(piece, index)
        if isinstance(event, dict) and "Failed to cast value to decimal" in found.group(2):
            for column in ("ts", "dur"):
                value = event.get(column)
                if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) >= US_LIMIT:
                    return _time_refused(self.path, number, event.get("name"), column, value)
        return TraceFormatError(self.path, f"malformed event (event {number}: {found.group(2).strip()})")


class Converted:
    """One trace, staged and checked (its staged events and small tables of ``con``), its facts,
    and the queries that write its parts (``parts``)."""

    def __init__(self, trace: KinetoTrace, con: duckdb.DuckDBPyConnection, staged: str) -> None:
        self.path = Path(trace.path)
        self.con = con
        self.base_ns = trace.base_time_ns
        con.execute(f"CREATE OR REPLACE TEMP VIEW ev AS SELECT * FROM {staged}")
        communication = self._check_times()
        try:
            con.execute(_COMM_TABLE if communication else _NO_COMM_TABLE)
        except duckdb.Error as exc:
            raise _refusal(self.path, exc) from None
        self.conversion = self._steps_and_facts()

    def _check_times(self) -> bool:
        """Refuse the trace at the first event whose time the store cannot hold, or whose
        duration is negative, or whose args are not an object (checks in this order). In the
        same scan: whether the trace has communication events (the ``comm`` table's input)."""
        lowest = INT64_MIN + MARGIN_NS - self.base_ns
        highest = INT64_MAX - MARGIN_NS - self.base_ns
        checks = {
            "ts": f"ts_beyond IS NOT NULL OR ts_rel < {lowest} OR ts_rel > {highest}",
            "dur": "dur_beyond IS NOT NULL",
            "negative": "dur_ns < 0",
            "end": f"CASE WHEN dur_ns >= 0 THEN ts_rel > {INT64_MAX - self.base_ns} - dur_ns END",
            "args": "args_not_object",
        }
        select = ", ".join(f"min(i) FILTER ({condition})" for condition in checks.values())
        *first, communication = self.con.execute(
            f"SELECT {select}, count(*) FILTER (category = 'communication') > 0 FROM ev").fetchone()
        for check, index in zip(checks, first):
            if index is not None:
                raise self._time_refusal(check, index)
        return bool(communication)

    def _time_refusal(self, check: str, index: int) -> TraceFormatError:
        name, ts_rel, dur_ns, ts_beyond, dur_beyond = self.con.execute(
            "SELECT name, ts_rel, dur_ns, ts_beyond, dur_beyond FROM ev WHERE i = ?", [index]).fetchone()
        if check == "negative":
            return TraceFormatError(self.path, f"event {index} ({name!r}) has a negative duration")
        if check == "args":
            return TraceFormatError(self.path, f"event {index}: args is not an object")
        column = "ts" if check == "ts" else "dur"
        text = ts_beyond if column == "ts" else dur_beyond
        ns = ts_rel if column == "ts" else dur_ns
        return _time_refused(self.path, index, name, column, _decimal_text(text or f"{ns / 1000:.3f}"))

    def _steps_and_facts(self) -> Conversion:
        """The steps, the step lookup by time, each launch's step, and the trace's facts."""
        con = self.con
        params = {"base": self.base_ns}
        con.execute("""
            CREATE OR REPLACE TEMP TABLE step_windows AS
            SELECT step_no AS step, min(ts_rel) + $base AS start_ns, max(ts_rel + dur_ns) + $base AS end_ns
            FROM ev WHERE step_no IS NOT NULL AND ts_rel IS NOT NULL GROUP BY step_no
        """, params)
        lo, hi = con.execute("SELECT min(start_ns), max(end_ns) FROM step_windows").fetchone()
        self._buckets = (lo, hi, max(1, -(-(hi - lo) // STEP_BUCKETS)) if lo is not None else 1)
        width = self._buckets[2]
        # Per time bucket: the steps overlapping it and the last one to start before it, so that
        # ``step_in`` finds the window that starts last at or before a time in the bucket.
        con.execute(f"""
            CREATE OR REPLACE TEMP TABLE step_buckets AS
            WITH b AS (SELECT range AS b, {lo or 0} + range * {width} AS lo, {lo or 0} + (range + 1) * {width} AS hi
                       FROM range(0, {STEP_BUCKETS if lo is not None else 0})),
            cands AS (
                SELECT b.b, s.* FROM b JOIN step_windows s ON s.start_ns < b.hi AND s.end_ns > b.lo
                UNION
                SELECT b.b, s.* FROM b ASOF JOIN step_windows s ON b.lo >= s.start_ns)
            SELECT b, list({{'s': start_ns, 'e': end_ns, 'n': step}} ORDER BY start_ns, step) AS cands
            FROM cands GROUP BY b
        """)
        # The step of each correlation id's launch (the first in the file): GPU work takes it, so
        # a kernel launched in step N that runs after N's CPU window still counts for N.
        con.execute(f"""
            CREATE OR REPLACE TEMP TABLE launch_step AS
            SELECT correlation, arg_min(step, i) AS step FROM (
                SELECT e.i, e.correlation, step_in(k.cands, e.ts_rel + $base) AS step
                FROM ev e LEFT JOIN step_buckets k ON k.b = {self._bucket_of("e.ts_rel + $base")}
                WHERE e.kind IN {_sql_set(LAUNCH_KINDS)} AND e.correlation IS NOT NULL)
            GROUP BY correlation
        """, params)
        count, start, end = con.execute("""
            SELECT count(*), min(ts_rel) FILTER (ph <> 'M') + $base,
                   max(ts_rel + coalesce(dur_ns, 0)) FILTER (ph <> 'M') + $base
            FROM ev
        """, params).fetchone()
        device = con.execute(
            "SELECT device FROM (SELECT coalesce(device_arg, device_id) AS device FROM ev WHERE kind = 'kernel') "
            "WHERE device IS NOT NULL GROUP BY device ORDER BY count(*) DESC, device LIMIT 1").fetchone()
        pid = con.execute(
            f"SELECT pid FROM ev WHERE pid IS NOT NULL AND kind IN {_sql_set(HOST_KINDS)} "
            "GROUP BY pid ORDER BY count(*) DESC, pid LIMIT 1").fetchone()
        steps = tuple(s for (s,) in con.execute("SELECT step FROM step_windows ORDER BY step").fetchall())
        return Conversion(count, start, end, device[0] if device else None, pid[0] if pid else None, steps)

    def _bucket_of(self, t: str) -> str:
        """SQL for the step-lookup bucket of the time ``t`` (null outside every step window)."""
        lo, hi, width = self._buckets
        if lo is None:
            return "NULL::BIGINT"
        return f"CASE WHEN {t} >= {lo} AND {t} < {hi} THEN ({t} - {lo}) // {width} END"

    def parts(self, source: str) -> dict[str, SqlPart]:
        """The parts this trace writes (events, steps, memory), as queries over its tables."""
        params = {"source": source, "base": self.base_ns}
        gpu = _sql_set(GPU_SIDE_KINDS)
        events = f"""
            SELECT $source AS source, e.kind, e.category, e.name, e.ph, e.ts_rel + $base AS ts_ns, e.dur_ns,
                   e.pid, e.tid, e.thread_label, e.stream, coalesce(e.device_arg, e.device_id) AS device,
                   e.correlation, e.external_id, e.flow_id,
                   CASE WHEN e.ts_rel IS NULL THEN NULL
                        WHEN e.kind IN {gpu} AND l.correlation IS NOT NULL THEN l.step
                        ELSE step_in(k.cands, e.ts_rel + $base) END AS step,
                   CASE WHEN c.nbytes IS NOT NULL THEN c.nbytes
                        WHEN e.kind = 'memory' THEN e.signed_bytes ELSE e.args_bytes END AS bytes,
                   c.collective, c.in_nelems, c.out_nelems, c.dtype, e.group_size, e.pg_name, e.pg_desc,
                   CASE WHEN json_type(e.pg_ranks) = 'VARCHAR' THEN e.pg_ranks ->> '$'
                        WHEN json_type(e.pg_ranks) = 'ARRAY' THEN e.pg_ranks::VARCHAR END AS pg_ranks,
                   e.comm_seq, e.args::VARCHAR AS args
            FROM ev e
            LEFT JOIN step_buckets k ON k.b = {self._bucket_of("e.ts_rel + $base")}
            LEFT JOIN launch_step l ON e.kind IN {gpu} AND l.correlation = e.correlation
            LEFT JOIN comm c ON c.i = e.i
        """
        memory = f"""
            SELECT $source AS source, e.ts_rel + $base AS ts_ns, step_in(k.cands, e.ts_rel + $base) AS step,
                   e.addr, e.signed_bytes AS bytes, e.total_allocated, e.total_reserved, e.device_type,
                   e.device_id AS device
            FROM ev e LEFT JOIN step_buckets k ON k.b = {self._bucket_of("e.ts_rel + $base")}
            WHERE e.kind = 'memory' AND e.ts_rel IS NOT NULL
            ORDER BY e.ts_rel, e.i
        """
        return {"events": SqlPart(self.con, self.path, events, params),
                "steps": SqlPart(self.con, self.path, _STEPS_PART, {"source": source}),
                "memory": SqlPart(self.con, self.path, memory, params)}


def convert(trace: KinetoTrace, con: duckdb.DuckDBPyConnection, staged: str) -> Converted:
    """Check a trace's staged events (``Stager.close``'s relation) and find its steps in ``con``.
    Raises ``TraceFormatError``."""
    return Converted(trace, con, staged)


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
