"""Reading a CUDA memory snapshot pickle without ever running anything in it.

``torch.cuda.memory._dump_snapshot("x.pickle")`` writes the caching allocator's state with
``pickle``, and a pickle can name any importable callable and call it while it loads. A real
snapshot is only dicts, lists, tuples, strings, numbers, booleans and None (checked on the real
ones in the tests), so ``SnapshotUnpickler`` refuses every global, extension code and persistent
id: nothing a user hands stepscope can import or run code. This is the one place snapshots are
unpickled; the collector imports it from here (the store must not import the collector).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any, BinaryIO

from stepscope.errors import TraceFormatError
from stepscope.store.files import open_regular_file

PICKLE_PROTOCOLS = frozenset({2, 3, 4, 5})
"""Protocols a snapshot can be in: torch >= 2.0 runs on Python >= 3.8, whose default protocol
is 4 (5 from Python 3.14); 2 and 3 when a user re-dumped one with an older protocol."""


class SnapshotUnpickler(pickle.Unpickler):
    """An unpickler for memory snapshots that refuses to import anything."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused global {module}.{name}: a memory snapshot holds "
                                     "only plain data")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused persistent id: a memory snapshot holds only plain data")


def looks_like_snapshot(head: bytes) -> bool:
    """Whether a file starting with ``head`` is a binary pickle (what a snapshot is): the
    ``PROTO`` opcode and a protocol of ``PICKLE_PROTOCOLS``. Decided on content, not the name."""
    return len(head) >= 2 and head[0] == 0x80 and head[1] in PICKLE_PROTOCOLS


def is_snapshot_file(path: str | Path) -> bool:
    """Whether ``path`` is a regular file whose first bytes say it is a pickle (see above)."""
    try:
        with open_regular_file(Path(path)) as handle:
            return looks_like_snapshot(handle.read(2))
    except OSError:
        return False


def unpickle(source: BinaryIO, path: str | Path) -> Any:
    """Unpickle ``source`` with ``SnapshotUnpickler``. Whatever goes wrong in it (a refused
    global, a truncated stream, an opcode applied to the wrong object, a length that exhausts
    memory) is a ``TraceFormatError`` naming ``path``; nothing in it runs."""
    return load_with(SnapshotUnpickler(source), path)


def load_with(unpickler: SnapshotUnpickler, path: str | Path) -> Any:
    """``unpickler.load()``, its failures as one ``TraceFormatError`` line naming ``path``."""
    try:
        return unpickler.load()
    except TraceFormatError:
        raise
    except MemoryError as exc:
        raise TraceFormatError(path, "not a readable memory snapshot (a length in it exhausts memory)") from exc
    except Exception as exc:  # noqa: BLE001 - malformed pickles raise almost any type
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())
        if isinstance(exc, EOFError) or "truncated" in detail or "pickle data was truncated" in detail:
            raise TraceFormatError(path, f"truncated memory snapshot ({detail})") from exc
        raise TraceFormatError(path, f"not a readable memory snapshot ({detail})") from exc


def checked_snapshot(value: Any, path: str | Path) -> dict[str, Any]:
    """``value`` when it is a snapshot (a dict with a list of ``segments``), else the error."""
    if not isinstance(value, dict) or not isinstance(value.get("segments"), list):
        raise TraceFormatError(path, "not a memory snapshot (no list of 'segments')")
    return value


def load_snapshot(path: str | Path) -> dict[str, Any]:
    """Read a whole snapshot pickle safely (small files, the collector's tests). Any file that
    is not a readable snapshot is a ``TraceFormatError``. Ingest streams instead
    (``stepscope.store.snapshot.reader``), to hold far less than the whole snapshot."""
    try:
        with open_regular_file(Path(path)) as handle:
            data = handle.read()
    except OSError as exc:
        raise TraceFormatError(path, f"cannot read file ({exc.strerror or exc})") from exc
    if not data.startswith(b"\x80"):
        raise TraceFormatError(path, "not a memory snapshot (not a binary pickle)")
    return checked_snapshot(unpickle(io.BytesIO(data), path), path)
