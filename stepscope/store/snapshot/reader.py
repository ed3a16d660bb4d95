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
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any, BinaryIO

from stepscope.errors import TraceFormatError
from stepscope.store.constants import INT64_MIN
from stepscope.store.files import open_regular_file
from stepscope.store.snapshot.unpickle import SnapshotUnpickler, checked_snapshot, load_with

SCAN_BYTES = 16 << 20
"""Input read between two takes of the completed entries: what is held in full between them."""
NULL = INT64_MIN
"""A value absent from an entry, in the integer columns (made null when the table is built)."""
NO_STACK = -1
_FIELDS = itemgetter("action", "addr", "size", "stream", "time_us", "frames")

Frame = tuple[Any, Any, Any]
"""``(filename, line, name)`` of one frame, as recorded."""


class _Reordered(Exception):
    """The entries taken early are not the device lists' entries in order: read again."""


@dataclass
class History:
    """The allocator's event history as columns, in the file's order (device by device)."""

    actions: list[str] = field(default_factory=list)
    action: array = field(default_factory=lambda: array("B"))
    address: array = field(default_factory=lambda: array("q"))
    size: array = field(default_factory=lambda: array("q"))
    stream: array = field(default_factory=lambda: array("q"))
    time_us: array = field(default_factory=lambda: array("q"))
    stack: array = field(default_factory=lambda: array("q"))
    device_rows: list[int] = field(default_factory=list)
    """How many entries each device's list holds, in ``device_traces`` order."""

    def __len__(self) -> int:
        return len(self.action)


class Stacks:
    """Each distinct stack once: its id is its position in ``frames``. Frame dicts are shared by
    the entries that hold them (torch writes each frame once, the pickle memo keeps it so), so a
    stack is first looked up by the identities of its frame dicts, and only a new one by value."""

    def __init__(self) -> None:
        self.frames: list[tuple[Frame, ...]] = []
        self._by_value: dict[tuple[Frame, ...], int] = {}
        self.by_ids: dict[tuple[int, ...], int] = {}
        self._alive: list[tuple[Any, ...]] = []

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
    """Moves history entries into ``History`` columns and empties them."""

    def __init__(self) -> None:
        self.history = History()
        self.stacks = Stacks()
        self.taken = array("Q")
        self._codes: dict[str, int] = {}

    def take(self, entries: Iterable[Any]) -> None:
        """Take ``entries`` in order (one loop with its lookups bound: it runs millions of times)."""
        h, codes, new_action, stack_id = self.history, self._codes, self._new_action, self.stacks.stack_id
        by_ids = self.stacks.by_ids
        action_col, address_col, size_col = h.action.append, h.address.append, h.size.append
        stream_col, time_col, stack_col, taken = h.stream.append, h.time_us.append, h.stack.append, self.taken.append
        for entry in entries:
            if type(entry) is not dict:
                raise TypeError("a history entry is not an object")
            try:
                action, address, size, stream, time_us, frames = _FIELDS(entry)
            except KeyError:  # torch 2.0 writes no time_us; any other field may be missing too
                get = entry.get
                action, address, size, stream, time_us, frames = (get("action"), get("addr"), get("size"),
                                                                  get("stream"), get("time_us"), get("frames"))
            code = codes.get(action)
            action_col(new_action(action) if code is None else code)
            address_col(NULL if address is None else address)
            size_col(NULL if size is None else size)
            stream_col(NULL if stream is None else stream)
            time_col(NULL if time_us is None else time_us)
            if type(frames) is list and frames and type(frames[0]) is not int:
                stack = by_ids.get(tuple(map(id, frames)))  # ``Stacks.stack_id``'s first step, inlined
                if stack is None:
                    stack = stack_id(frames)
                frames[:] = (stack,)  # one shared int per stack, in place of the frames
            else:
                stack = stack_id(frames)
            stack_col(stack)
            taken(id(entry))
            entry.clear()

    def _new_action(self, action: Any) -> int:
        if not isinstance(action, str):
            raise TypeError("a history entry has no action")
        if len(self.history.actions) >= 255:
            raise ValueError("more than 255 kinds of history action")
        self._codes[action] = len(self.history.actions)
        self.history.actions.append(action)
        return self._codes[action]


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
        except (TypeError, ValueError, OverflowError) as exc:  # raised by a take
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
    except (TypeError, ValueError, OverflowError) as exc:
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
