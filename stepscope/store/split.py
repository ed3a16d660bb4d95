"""Split a Kineto trace's JSON text, as it streams by, into its events and its top-level keys.

A Kineto trace is one object: metadata keys, the ``traceEvents`` array (all but a few KB of the
file), more keys after it. The events are written to disk in pieces of about ``PIECE_BYTES``,
each a JSON array of whole events, which DuckDB then reads (``convert.py``); the other keys are
decoded here (they are small). Nothing holds more than about two pieces of text at a time.

Where a piece may end is found without a byte-by-byte scan in Python: a candidate cut is a ``}``
followed by ``,`` and ``{`` (the gap between two events, in compact or in Kineto's indented
layout), and msgspec, parsing ``[`` + piece + ``]`` in C, proves it right. From a known event
boundary, the text up to a true boundary parses as a list of whole values; a cut inside a string
or a nested value leaves a string unterminated or a bracket open, which the parser reports at or
past the cut. An error *before* the cut is the file's own. The same parse removes whitespace
outside strings, which is the trace's content hash (``sources.content_sha256``): the hash is taken
piece by piece, so it equals the hash of ``msgspec.json.format(text, indent=-1)`` of the whole
text, the definition stores written before this module used.

Every failure is a ``TraceFormatError`` whose message is ``<file>: <problem>``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import msgspec

from stepscope.errors import TraceFormatError

PIECE_BYTES = 8 << 20
"""Target size of one piece of events text (one file DuckDB reads and types in one statement).
Each statement costs its planning (~40 ms for the typing query), so fewer, bigger pieces are
cheaper: on df_index_resolver (54 MB of JSON) 16 MB pieces took the staging from 3.05 s to
2.25-2.5 s of CPU against 4 MB ones. But the split holds about two pieces of text while DuckDB
types the one before: once ingest stopped loading pyarrow and its DuckDB limits came down
(``ingest.DEFAULT_INGEST_MEMORY_LIMIT``), that was the peak of a long trace. With 16 MB pieces
df_index_resolver's events repeated 5x peaked at 201 MB against 153 MB for the original (1.31x);
with 8 MB pieces at 172 MB (1.12x), the original unchanged."""
HEAD_LIMIT = 256 << 20
"""Text read looking for ``traceEvents`` before a file is declared not a Kineto trace."""
CUT_TRIES = 16
"""Candidate cuts tried per piece before the piece grows (each try parses the piece)."""
DEEP = "JSON nested too deeply (more than ~1000 levels)"

_KEY = b'"traceEvents"'
_WS = b" \t\r\n"
_ERROR_AT = re.compile(r"\(byte (\d+)\)")
_ANY = msgspec.json.Decoder()
_TAIL_OPEN = b'{"traceEvents":[]'
_HEAD_CLOSE = b'"traceEvents":[]}'


@dataclass
class SplitTrace:
    """A trace's events as piece files plus everything else it holds."""

    pieces: list[Path] = field(default_factory=list)
    """JSON arrays of whole events, in the file's order, whitespace between tokens removed (one
    empty array when the trace has no events)."""
    top: dict[str, Any] = field(default_factory=dict)
    """The top-level keys other than ``traceEvents``, decoded."""
    content_sha256: str = ""
    events_bytes: int = 0


def _compact(path: Path, text: bytes | bytearray | memoryview) -> bytes:
    """``text`` with whitespace outside strings removed; raises ``msgspec.DecodeError``."""
    try:
        return msgspec.json.format(text, indent=-1)
    except RecursionError as exc:
        raise TraceFormatError(path, DEEP) from exc


def _decode_top(path: Path, compact: bytes) -> Any:
    """The top-level keys' compact text, decoded. ``msgspec.json.format`` checks the grammar but
    not the strings' encoding: invalid UTF-8 in a top-level key or value surfaces only here."""
    try:
        return _ANY.decode(compact)
    except msgspec.DecodeError as exc:
        raise TraceFormatError(path, f"not valid JSON in the top-level keys ({exc})") from exc


def _error_position(exc: msgspec.DecodeError) -> int | None:
    """The byte msgspec stopped at; None when the text ended first ("truncated")."""
    found = _ERROR_AT.search(str(exc))
    return int(found.group(1)) if found else None


def _skip_ws(buf: bytes | bytearray, at: int) -> int:
    while at < len(buf) and buf[at] in _WS:
        at += 1
    return at


def not_kineto_reason(text: bytes) -> str:
    """Why a whole JSON document without a top-level ``traceEvents`` array is not a trace."""
    try:
        doc = _ANY.decode(text)
    except RecursionError:
        return DEEP
    except msgspec.DecodeError as exc:
        return f"not valid JSON ({exc})"
    if isinstance(doc, list):
        return "not a Kineto trace: the JSON is a bare array, not an object with traceEvents"
    if isinstance(doc, dict) and "nodes" in doc:
        return "not a Kineto trace: this is a PyTorch Execution Trace (it has 'nodes', no traceEvents)"
    return "not a Kineto trace: no traceEvents list"


class _Splitter:
    """One pass over the text blocks: head (up to the array), body (pieces), end (the rest)."""

    def __init__(self, path: Path, blocks: Iterator[bytes], workdir: Path,
                 on_piece: Callable[[Path], None] | None) -> None:
        self.path = path
        self.on_piece = on_piece
        self.blocks = blocks
        self.workdir = workdir
        self.buf = bytearray()
        self.offset = 0
        """Position in the whole text of ``buf[0]`` (for error messages)."""
        self.eof = False
        self.hash = hashlib.sha256()
        self.result = SplitTrace()

    def _more(self) -> bool:
        """Append the next block to ``buf``; False at the end of the text."""
        if self.eof:
            return False
        block = next(self.blocks, None)
        if block is None:
            self.eof = True
            return False
        self.buf += block
        return True

    def _drop(self, count: int) -> None:
        del self.buf[:count]
        self.offset += count

    def _proven(self, data: bytes | bytearray, end: int) -> bytes | None:
        """``data[:end]`` as a compact array when msgspec proves it whole events; None when the
        cut fell inside a string or value (or past the array's end); a real syntax error before
        ``end`` is the trace's error."""
        wrapped = bytearray(b"[")
        wrapped += memoryview(data)[:end]
        wrapped += b"]"
        try:
            return _compact(self.path, wrapped)
        except msgspec.DecodeError as exc:
            at = _error_position(exc)
            if at is not None and at <= end and "trailing characters" not in str(exc):
                raise self._invalid(exc, shift=1) from exc
            return None

    def _invalid(self, exc: msgspec.DecodeError, shift: int) -> TraceFormatError:
        """The file's own syntax error, its byte position made relative to the whole text."""
        message = str(exc)
        at = _error_position(exc)
        if at is not None:
            message = _ERROR_AT.sub(f"(byte {self.offset + at - shift})", message)
        return TraceFormatError(self.path, f"not valid JSON ({message})")

    def run(self) -> SplitTrace:
        self._head()
        self._body()
        return self.result

    # -- head: the keys before the array --------------------------------------------------------

    def _head(self) -> None:
        search = 0
        while True:
            start = _skip_ws(self.buf, 0)
            if start == len(self.buf):
                if not self._more():
                    raise TraceFormatError(self.path, "empty trace (no JSON text)")
                continue
            if self.buf[start] == ord("["):
                raise TraceFormatError(self.path, "not a Kineto trace: the JSON is a bare array, "
                                                  "not an object with traceEvents")
            found = self.buf.find(_KEY, search)
            if found >= 0:
                opened = self._array_after_key(found)
                if opened is None:  # the key's value is not in ``buf`` yet
                    if not self._more():
                        self._not_a_trace()
                    continue
                if opened > 0 and self._head_keys(found):
                    self._drop(opened)
                    return
                search = found + 1
                continue
            search = max(0, len(self.buf) - len(_KEY))
            if len(self.buf) > HEAD_LIMIT:
                raise TraceFormatError(self.path, "not a Kineto trace: no traceEvents list in the "
                                                  f"first {HEAD_LIMIT >> 20} MB of JSON")
            if not self._more():
                self._not_a_trace()

    def _array_after_key(self, found: int) -> int | None:
        """Index just past the ``[`` that follows ``"traceEvents" :``; 0 when something else
        follows the key; None when ``buf`` ends first."""
        at = _skip_ws(self.buf, found + len(_KEY))
        if at == len(self.buf):
            return None
        if self.buf[at] != ord(":"):
            return 0
        at = _skip_ws(self.buf, at + 1)
        if at == len(self.buf):
            return None
        return at + 1 if self.buf[at] == ord("[") else 0

    def _head_keys(self, found: int) -> bool:
        """Is the key at ``found`` a key of the top-level object? If so, decode the keys before
        it and hash their compact text."""
        text = bytes(self.buf[:found]) + _HEAD_CLOSE
        try:
            compact = _compact(self.path, text)
        except msgspec.DecodeError:
            return False  # inside a string or a nested value
        top = _decode_top(self.path, compact)
        if not isinstance(top, dict):
            return False
        top.pop("traceEvents", None)
        self.result.top.update(top)
        self.hash.update(memoryview(compact)[: -2])  # up to and including '['
        return True

    def _not_a_trace(self) -> None:
        raise TraceFormatError(self.path, not_kineto_reason(bytes(self.buf)))

    # -- body: pieces of whole events -------------------------------------------------------------

    def _body(self) -> None:
        while True:
            while len(self.buf) < PIECE_BYTES and self._more():
                pass
            if self.eof:
                self._end()
                return
            if not self._cut():
                self._more()  # no provable cut yet: one event is bigger than a piece; grow

    def _candidates(self) -> Iterator[tuple[int, int]]:
        """``(end of piece, start of the next)`` for cuts between ``}`` ``,`` ``{``, last first."""
        buf = self.buf
        close = len(buf)
        while True:
            close = buf.rfind(b"}", 0, close)
            if close < 0:
                return
            comma = _skip_ws(buf, close + 1)
            if comma < len(buf) and buf[comma] == ord(","):
                nxt = _skip_ws(buf, comma + 1)
                if nxt < len(buf) and buf[nxt] == ord("{"):
                    yield close + 1, nxt

    def _cut(self) -> bool:
        """Emit the longest proven piece from the front of ``buf``; False if none was found."""
        for tried, (end, nxt) in enumerate(self._candidates()):
            if tried == CUT_TRIES:
                return False
            compact = self._proven(self.buf, end)
            if compact is None:
                continue  # the cut was inside a string or value (or past the array's end)
            self._emit(compact)
            self._drop(nxt)
            return True
        return False

    def _emit(self, compact: bytes) -> None:
        """Write one piece (``[...]``, compact) and hash its events."""
        if self.result.pieces:
            self.hash.update(b",")
        self.hash.update(memoryview(compact)[1:-1])  # "[]" adds nothing
        piece = self.workdir / f"events-{len(self.result.pieces):05d}.json"
        piece.write_bytes(compact)
        self.result.pieces.append(piece)
        self.result.events_bytes += len(compact)
        if self.on_piece is not None:
            self.on_piece(piece)

    # -- end: the last events, the array's ']' and the keys after it ------------------------------

    def _end(self) -> None:
        buf = self.buf
        close = len(buf)
        while True:
            close = buf.rfind(b"]", 0, close)
            if close < 0:
                raise TraceFormatError(self.path, "not valid JSON (the traceEvents array is never "
                                                  "closed, or the object after it is malformed)")
            tail = self._tail(close)
            if tail is None:
                continue
            if _skip_ws(buf, 0) >= close:  # an empty array
                if self.result.pieces:
                    continue  # a ',' must separate the pieces before from nothing: invalid
                self._emit(b"[]")  # one empty piece: the reader sees the columns, no rows
                self._finish(tail)
                return
            compact = self._proven(buf, close)
            if compact is None:
                continue
            self._emit(compact)
            self._finish(tail)
            return

    def _tail(self, close: int) -> tuple[bytes, dict[str, Any]] | None:
        """The compact text and the keys of what follows ``buf[close]``, if that ``]`` can end
        the array (the rest then closes the top-level object); else None.

        Parsed in place: the bytes before ``close + 1`` are overwritten with ``{"traceEvents":[]``
        for the parse and restored after it, so trying a candidate copies nothing (a wrong one
        usually fails within one event).
        """
        buf = self.buf
        start = close + 1 - len(_TAIL_OPEN)
        if start < 0:  # too near the front to overwrite: copy (a short text)
            text: bytes | memoryview = _TAIL_OPEN + bytes(buf[close + 1:])
            saved = None
        else:
            saved = bytes(buf[start:close + 1])
            buf[start:close + 1] = _TAIL_OPEN
            text = memoryview(buf)[start:]
        try:
            compact = _compact(self.path, text)
        except msgspec.DecodeError:
            return None
        finally:
            if saved is not None:
                del text  # release the view before the buffer is written to
                buf[start:close + 1] = saved
        top = _decode_top(self.path, compact)
        if not isinstance(top, dict):
            return None
        top.pop("traceEvents", None)
        return compact[len(_TAIL_OPEN):], top

    def _finish(self, tail: tuple[bytes, dict[str, Any]]) -> None:
        compact, keys = tail
        self.hash.update(b"]")
        self.hash.update(compact)
        self.result.top.update(keys)
        self.result.content_sha256 = self.hash.hexdigest()


def split_trace(path: Path, blocks: Iterator[bytes], workdir: Path,
                on_piece: Callable[[Path], None] | None = None) -> SplitTrace:
    """Split the text ``blocks`` of the trace ``path`` into event pieces written under
    ``workdir`` (each handed to ``on_piece`` as soon as it is written) and its other top-level
    keys. Raises ``TraceFormatError``."""
    return _Splitter(Path(path), blocks, Path(workdir), on_piece).run()
