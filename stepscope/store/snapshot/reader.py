"""A snapshot pickle read in one pass, holding little more than its history's columns.

Unpickled whole, a snapshot takes 4 to 6 times its file's size in Python objects (measured on
the two real ones: 5.7x and 4.1x), since every history entry is a dict with its own list of
frames. ``read_snapshot`` keeps the C unpickler (a Python one is ~10x slower) and, every
``SCAN_BYTES`` of input it reads, takes the history entries it has completed since: each one's
values go into compact columns, its stack into a table of stacks kept once each, and the entry
is emptied (``dict.clear()``; its frame list left holding only its stack id), so what stays
behind is an empty shell per entry (~170 bytes, below most entries' size in the file).

The entries are found in the unpickler's memo, which protocol 2+ pickles fill with every dict
and list in the order they are created (``gc.get_referents`` lists it, newest first, in
CPython). That order is the file's order, so the entries are taken in history order; after the
load the device lists are walked to check that every entry taken is there, in that order, and
still empty (an entry shared or written twice would not be): if not, or where the memo cannot be
seen, the file is read again without taking entries early. Either way the columns are the same;
only the memory differs.
"""

from __future__ import annotations

import gc
import hashlib
from array import array
from collections import deque
from dataclasses import dataclass, field
from itertools import chain, compress, repeat
from operator import eq, itemgetter, not_, setitem
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.compute as pc

from stepscope.errors import TraceFormatError
from stepscope.store.constants import INT64_MIN
from stepscope.store.files import open_regular_file
from stepscope.store.snapshot.unpickle import SnapshotUnpickler, checked_snapshot, load_with

SCAN_BYTES = 16 << 20
"""Input read between two takes of the completed entries: what is held in full between them."""
NO_STACK = -1
_INTEGER = {int, type(None)}
"""The types of a history entry's integer fields (pyarrow would also take a float, truncated)."""
_FIELDS = itemgetter("action", "addr", "size", "stream", "time_us", "frames")

Frame = tuple[Any, Any, Any]
"""``(filename, line, name)`` of one frame, as recorded."""


class _Reordered(Exception):
    """The entries taken early are not the device lists' entries in order: read again."""


@dataclass
class History:
    """The allocator's event history as columns, in the file's order (device by device): one
    pyarrow chunk per batch taken. ``action`` holds codes into ``actions``; the integer columns
    are null where an entry has no value; ``stack`` is ``NO_STACK`` for an entry without one."""

    actions: list[str] = field(default_factory=list)
    action: list[pa.Array] = field(default_factory=list)
    address: list[pa.Array] = field(default_factory=list)
    size: list[pa.Array] = field(default_factory=list)
    stream: list[pa.Array] = field(default_factory=list)
    time_us: list[pa.Array] = field(default_factory=list)
    stack: list[pa.Array] = field(default_factory=list)
    device_rows: list[int] = field(default_factory=list)
    """How many entries each device's list holds, in ``device_traces`` order."""
    rows: int = 0

    def add(self, columns: tuple[pa.Array, ...]) -> None:
        """Append one batch's columns (in the order of the fields above)."""
        for name, column in zip(("action", "address", "size", "stream", "time_us", "stack"), columns):
            getattr(self, name).append(column)
        self.rows += len(columns[0])

    def column(self, name: str) -> pa.Array:
        """One column whole (``action``: the codes)."""
        chunks = getattr(self, name)
        return pa.concat_arrays(chunks) if chunks else pa.array([], pa.uint8() if name == "action" else pa.int64())

    def __len__(self) -> int:
        return self.rows


class Stacks:
    """Each distinct stack once: its id is its position in ``frames``. Frame dicts are shared by
    the entries that hold them (torch writes each frame once, the pickle memo keeps it so), so a
    stack is first looked up by the identities of its frame dicts, and only a new one by value.

    ``stack_ids`` looks a batch up by those identities with ``map`` over C functions, so only
    a list not met before runs Python code (``stack_id``)."""

    def __init__(self) -> None:
        self.frames: list[tuple[Frame, ...]] = []
        self._by_value: dict[tuple[Frame, ...], int] = {}
        self.by_ids: dict[tuple[int, ...], int] = {(): NO_STACK}
        self._alive: list[tuple[Any, ...]] = []

    def stack_ids(self, lists: Sequence[list[Any]]) -> list[int]:
        """``stack_id`` of each of ``lists`` (frame lists, checked to be lists), in bulk. About
        half of a history's entries have the stack of the entry before them (``free_requested``
        then ``free_completed`` of one block, often the very same list): those are found by
        comparing each list with the one before (``list == list``, identity first) and take
        its id, so only the others are looked up."""
        n = len(lists)
        if n < 2:
            return [self.stack_id(frames) for frames in lists]
        new = [True, *map(not_, map(eq, lists[1:], lists[:-1]))]
        heads = list(compress(lists, new))
        ids = list(map(self.by_ids.get, map(tuple, map(map, repeat(id), heads))))
        if None in ids:
            for index in [i for i, found in enumerate(ids) if found is None]:
                ids[index] = self.stack_id(heads[index])
        if len(heads) == n:
            return ids
        spread: list[int | None] = [None] * n
        deque(map(spread.__setitem__, compress(range(n), new), ids), maxlen=0)
        return pc.fill_null_forward(pa.array(spread, pa.int64())).to_pylist()

    def stack_id(self, frames: Any) -> int:
        """The id of the stack ``frames`` (a list of frame dicts), or ``NO_STACK`` for none."""
        if not frames:
            return NO_STACK
        if type(frames) is not list:
            raise TypeError("frames is not a list")
        first = frames[0]
        if type(first) is int:  # a list already taken: it holds its stack id only
            return first
        key = tuple(map(id, frames))
        found = self.by_ids.get(key)
        if found is None:
            found = self.by_ids[key] = self._by_value_id(frames)
            self._alive.append(tuple(frames))  # the identities in ``key`` stay theirs
        return found

    def _by_value_id(self, frames: list[Any]) -> int:
        value = tuple(_frame(f) for f in frames)
        found = self._by_value.get(value)
        if found is None:
            found = self._by_value[value] = len(self.frames)  # the one int object of this id
            self.frames.append(value)
        return found

    def release(self) -> None:
        """Forget the identity index and let the frames it kept alive go."""
        self.by_ids.clear()
        self._alive.clear()


def _frame(frame: Any) -> Frame:
    if type(frame) is not dict:
        raise TypeError("a frame is not an object")
    filename, line, name = frame.get("filename"), frame.get("line"), frame.get("name")
    if not (filename is None or isinstance(filename, str)) or not (name is None or isinstance(name, str)):
        raise TypeError("a frame's filename or name is not a string")
    if not (line is None or type(line) is int):
        raise TypeError("a frame's line is not an integer")
    return filename, line, name


class _Taker:
    """Moves history entries into ``History`` columns and empties them, a batch at a time.

    The usual path runs no Python bytecode per entry (at ~6 us each, that was most of a large
    file's time): ``map`` over C functions (``itemgetter``, ``id``, ``dict.get``, ``dict.clear``)
    pulls the fields out and pyarrow converts each column in one call. Anything it does not expect (a missing field, as in
    torch 2.0 files, a value of the wrong type) sends the batch through ``_row``, entry by entry,
    which names what is wrong; both give the same columns."""

    def __init__(self) -> None:
        self.history = History()
        self.stacks = Stacks()
        self.taken = array("Q")
        self._codes: dict[str, int] = {}
        self._singles: dict[int, tuple[int]] = {}

    def take(self, entries: list[Any]) -> None:
        """Take ``entries`` (a list, in history order)."""
        if not entries:
            return
        try:
            fields = list(zip(*map(_FIELDS, entries)))  # TypeError on a non-dict, KeyError on a missing field
            columns, stacks = self._columns(fields)
        except (TypeError, KeyError, ValueError, OverflowError, RecursionError, pa.ArrowException):
            # RecursionError: ``list == list`` on frame lists that hold themselves (a hostile file)
            fields = list(zip(*map(_row, entries)))
            columns, stacks = self._columns(fields, bulk=False)
        self._empty(entries, fields[5], stacks)
        self.history.add(columns)

    def _columns(self, fields: list[tuple[Any, ...]], bulk: bool = True) -> tuple[tuple[pa.Array, ...], list[int]]:
        """The batch's columns and stack ids from its six fields (``zip(*entries' fields)``);
        the stacks in bulk, or (``bulk`` False) one by one, comparing no two lists."""
        actions, addresses, sizes, streams, times, frames = fields
        if set(map(type, frames)) - {list} or set(map(type, chain(addresses, sizes, streams, times))) - _INTEGER:
            raise TypeError("a history entry is not as torch writes it")  # ``_row`` says what
        stacks = self.stacks.stack_ids(frames) if bulk else list(map(self.stacks.stack_id, frames))
        codes = self._codes
        for action in set(actions) - codes.keys():
            self._new_action(action)
        return (pa.array(list(map(codes.__getitem__, actions)), pa.uint8()),
                pa.array(addresses, pa.int64()), pa.array(sizes, pa.int64()), pa.array(streams, pa.int64()),
                pa.array(times, pa.int64()), pa.array(stacks, pa.int64())), stacks

    def _empty(self, entries: list[Any], frames: Any, stacks: list[int]) -> None:
        """Empty the taken entries, and leave each one's frame list holding only its stack id
        (one shared tuple per stack), so that a list met again gives the same stack."""
        singles = self._singles
        for stack in set(stacks) - singles.keys():
            singles[stack] = (stack,)
        # an empty list is left empty (giving it an item would grow it: 0.4x a file of small entries)
        deque(map(setitem, compress(frames, frames), repeat(slice(None)),
                  map(singles.__getitem__, compress(stacks, frames))), maxlen=0)
        self.taken.extend(map(id, entries))
        deque(map(dict.clear, entries), maxlen=0)

    def _new_action(self, action: Any) -> int:
        if not isinstance(action, str):
            raise TypeError("a history entry has no action")
        if len(self.history.actions) >= 255:
            raise ValueError("more than 255 kinds of history action")
        self._codes[action] = len(self.history.actions)
        self.history.actions.append(action)
        return self._codes[action]


def _row(entry: Any) -> tuple[Any, ...]:
    """One entry's fields, checked: what ``_Taker`` falls back to when a batch is not as torch
    writes it (torch 2.0 writes no ``time_us``), and what says which value is wrong."""
    if type(entry) is not dict:
        raise TypeError("a history entry is not an object")
    get = entry.get
    numbers = []
    for what in ("addr", "size", "stream", "time_us"):
        value = get(what)
        if value is not None and type(value) is not int and type(value) is not bool:
            raise TypeError(f"a history entry's {what} is not an integer")
        if value is not None and not INT64_MIN <= value < 2**63:
            raise OverflowError(f"a history entry's {what} is out of range")
        numbers.append(None if value is None else int(value))
    frames = get("frames")
    if frames is not None and type(frames) is not list:
        raise TypeError("frames is not a list")
    return (get("action"), *numbers, [] if frames is None else frames)


class _Scanner:
    """Takes the entries the unpickler completed since the last scan, from its memo."""

    def __init__(self, taker: _Taker) -> None:
        self.taker = taker
        self.unpickler: SnapshotUnpickler | None = None
        self._prefix: int | None = None
        self._done = 0
        self.enabled = True

    def scan(self) -> None:
        if not self.enabled or self.unpickler is None:
            return
        refs = gc.get_referents(self.unpickler)
        if self._prefix is None:
            memo = self.unpickler.memo.copy()
            if not memo:
                return  # nothing read yet: look again at the next scan
            if len(refs) < len(memo) or refs[-1] is not memo.get(0):
                self.enabled = False  # not the CPython layout this relies on: take at the end
                return
            self._prefix = len(refs) - len(memo)
        region = refs[self._prefix:len(refs) - self._done]
        del refs
        region.reverse()  # the memo, from position ``_done`` on, in creation order
        last = next((i for i in range(len(region) - 1, -1, -1)
                     if type(region[i]) is dict and "action" in region[i]), -1)
        self.taker.take([o for o in region[:last + 1] if type(o) is dict and "action" in o])
        # the first empty dict after the last entry taken may be an entry still being filled
        pending = next((i for i in range(last + 1, len(region)) if type(region[i]) is dict and not region[i]), None)
        self._done += len(region) if pending is None else pending


class _Tap:
    """The file as the unpickler reads it: hashed, counted, and scanned every ``SCAN_BYTES``."""

    def __init__(self, handle: BinaryIO, scanner: _Scanner) -> None:
        self._handle = handle
        self._scanner = scanner
        self.sha256 = hashlib.sha256()
        self.bytes = 0
        self._next_scan = SCAN_BYTES

    def _count(self, data: bytes | memoryview) -> None:
        self.sha256.update(data)
        self.bytes += len(data)
        if self.bytes >= self._next_scan:
            self._next_scan = self.bytes + SCAN_BYTES
            self._scanner.scan()

    def read(self, n: int = -1) -> bytes:
        data = self._handle.read(n)
        self._count(data)
        return data

    def readinto(self, buffer: Any) -> int:
        n = self._handle.readinto(buffer)
        self._count(memoryview(buffer)[:n])
        return n

    def readline(self) -> bytes:
        data = self._handle.readline()
        self._count(data)
        return data


@dataclass
class SnapshotRead:
    """What one pass over a snapshot file gives: the snapshot without its ``device_traces``
    (segments, blocks, settings as they were), the history as columns, the stacks, and the
    file's sha256 and size."""

    snapshot: dict[str, Any]
    history: History
    stacks: Stacks
    sha256: str
    file_bytes: int
    taken_early: int = 0
    """How many history entries were taken while the file was still being read."""


def read_snapshot(path: str | Path, *, stream: bool = True) -> SnapshotRead:
    """Read the snapshot at ``path`` (see the module's doc). Any problem is one
    ``TraceFormatError`` naming ``path``."""
    try:
        return _read(Path(path), stream)
    except _Reordered:
        return _read(Path(path), False)


def _read(path: Path, stream: bool) -> SnapshotRead:
    taker = _Taker()
    scanner = _Scanner(taker)
    scanner.enabled = stream
    try:
        handle = open_regular_file(path)
    except OSError as exc:
        raise TraceFormatError(path, f"cannot read file ({exc.strerror or exc})") from exc
    with handle:
        tap = _Tap(handle, scanner)
        scanner.unpickler = SnapshotUnpickler(tap)  # type: ignore[arg-type]
        collecting = gc.isenabled()
        gc.disable()  # millions of new dicts and lists, none of them garbage: ~25% of the CPU time
        try:
            loaded = load_with(scanner.unpickler, path)
        except (TypeError, ValueError, OverflowError, pa.ArrowException) as exc:  # raised by a take
            raise TraceFormatError(path, f"not a memory snapshot ({exc})") from exc
        finally:
            scanner.unpickler = None
            if collecting:
                gc.enable()
        if handle.read(1):
            raise TraceFormatError(path, "not a memory snapshot (data after the pickle's end)")
    snapshot = checked_snapshot(loaded, path)
    early = len(taker.taken)
    try:
        _take_the_rest(snapshot, taker)
    except (TypeError, ValueError, OverflowError, pa.ArrowException) as exc:
        raise TraceFormatError(path, f"not a memory snapshot ({exc})") from exc
    snapshot.pop("device_traces", None)  # only empty shells now: their memory goes before the tables
    return SnapshotRead(snapshot, taker.history, taker.stacks, tap.sha256.hexdigest(), tap.bytes, early)


def _take_the_rest(snapshot: dict[str, Any], taker: _Taker) -> None:
    """Check the entries taken early against the device lists, take the rest, count them."""
    traces = snapshot.get("device_traces")
    if traces is None:
        traces = []
    if type(traces) is not list or not all(type(t) is list for t in traces):
        raise TypeError("device_traces is not a list of lists")
    early, taken = len(taker.taken), taker.taken
    position = 0
    for entries in traces:
        seen = min(len(entries), early - position)  # this list's entries taken early
        for index in range(seen):
            entry = entries[index]
            if id(entry) != taken[position + index] or entry:
                raise _Reordered
        position += seen
        taker.take(entries[seen:])
        taker.history.device_rows.append(len(entries))
    if position < early:
        raise _Reordered
