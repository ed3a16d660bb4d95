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
from collections.abc import Iterator
from contextlib import contextmanager
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


HEADROOM_BYTES = 1 << 30
HEADROOM_PER_FILE_BYTE = 32
"""Address space an unpickle may add: 1 GiB plus 32 bytes per byte of the file. A real
snapshot's objects take a few times its size; CPython's unpickler, though, grows its memo table
to twice any index a ``LONG_BINPUT`` names, and zero-fills it, so 12 bytes naming index 671
million cost 10.7 GB (the fuzz campaign's snapshot run was killed by the kernel at 21 GB).
Bounded, such an allocation fails and the file is refused."""


@contextmanager
def _bounded_address_space(path: str | Path) -> Iterator[None]:
    """This process's address space bounded (``RLIMIT_AS``) to what it uses now plus the
    headroom above while the unpickle runs, then restored. Only ever tightens a limit; where the
    platform has no such limit (no ``resource``, no ``/proc``) it is a no-op. Snapshots are
    unpickled by stepscope's own ingest processes and tests, not inside training, so no other
    thread of the process is allocating meanwhile."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/status") as status:
            used = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
        bound = used + HEADROOM_BYTES + HEADROOM_PER_FILE_BYTE * Path(path).stat().st_size
    except (ImportError, OSError, StopIteration, ValueError):
        yield
        return
    unlimited = resource.RLIM_INFINITY
    if (soft != unlimited and soft <= bound) or (hard != unlimited and hard < bound):
        yield
        return
    resource.setrlimit(resource.RLIMIT_AS, (bound, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def load_with(unpickler: SnapshotUnpickler, path: str | Path) -> Any:
    """``unpickler.load()``, its failures as one ``TraceFormatError`` line naming ``path``; its
    memory bounded (:func:`_bounded_address_space`)."""
    try:
        with _bounded_address_space(path):
            return unpickler.load()
    except TraceFormatError:
        raise
    except MemoryError as exc:
        raise TraceFormatError(path, "not a readable memory snapshot (a length or memo index in it exhausts "
                               "memory)") from exc
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
