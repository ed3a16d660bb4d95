"""Which paths are trace files, and reading one without ever blocking on something that is not.

Only regular files are read. A FIFO named on the command line used to hang ``ingest`` forever
(``open`` waits for a writer); folder scans skipped FIFOs, broken links and symlink loops without a
word; a missing path aborted the whole batch. Here each such path gets one ``<path>: <problem>``
line and the rest of the batch goes on. The check is made twice: when the files are chosen, and
again on the open file descriptor (opened non-blocking), so a path swapped for a FIFO in between
cannot hang the reader either.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterable

TRACE_SUFFIXES = (".json", ".json.gz")

NOT_REGULAR: dict[int, str] = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}
"""File types that are never read, by ``stat.S_IFMT`` of their mode, and how they are named."""


class NotRegularFile(OSError):
    """The path is something other than a regular file or a folder; ``kind`` says what."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"not a regular file ({kind})")
        self.kind = kind


@dataclass
class Selection:
    """The trace files to read, in order, and one line for every path that cannot be read."""

    files: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _kind(mode: int) -> str:
    return NOT_REGULAR.get(stat.S_IFMT(mode), "not a file or folder")


def path_problem(path: Path) -> str | None:
    """Why ``path`` cannot be read as a file or folder, or None when it can."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        if path.is_symlink():
            return f"broken symbolic link (points to {os.readlink(path)}, which does not exist)"
        return "no such file or folder"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "symbolic link loop"
        return f"cannot read ({exc.strerror or exc})"
    if stat.S_ISDIR(mode) or stat.S_ISREG(mode):
        return None
    return f"not a regular file ({_kind(mode)})"


def _scan(folder: Path, selection: Selection) -> None:
    """Trace-named entries under ``folder`` (symlinked folders are not followed), sorted."""
    found: list[Path] = []

    def unreadable(exc: OSError) -> None:
        selection.problems.append(f"{exc.filename}: cannot read folder ({exc.strerror or exc})")

    for directory, _folders, names in os.walk(folder, onerror=unreadable):
        for name in names:
            if not name.endswith(TRACE_SUFFIXES):
                continue
            path = Path(directory) / name
            problem = path_problem(path)  # folders are in ``_folders``: here it is a file or not
            if problem is None:
                found.append(path)
            else:
                selection.problems.append(f"{path}: {problem}")
    selection.files.extend(sorted(found))


def select_trace_files(paths: Iterable[str | Path]) -> Selection:
    """Files given, plus ``*.json``/``*.json.gz`` found under folders given (sorted per folder).

    Anything else (a missing path, a broken link, a FIFO, socket or device, named or found) is a
    line in ``problems``, never an exception and never a blocked read.
    """
    selection = Selection()
    for item in paths:
        path = Path(item)
        problem = path_problem(path)
        if problem is not None:
            selection.problems.append(f"{path}: {problem}")
        elif path.is_dir():
            _scan(path, selection)
        else:
            selection.files.append(path)
    return selection


def open_regular_file(path: Path) -> BinaryIO:
    """``path`` opened for reading; raises ``NotRegularFile`` (an ``OSError``) for anything but a
    regular file.

    Opened non-blocking, so that opening a FIFO returns at once instead of waiting for a writer;
    the type is checked on the descriptor itself, so nothing can be swapped in after the check.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    handle = os.fdopen(fd, "rb")
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        handle.close()
        raise NotRegularFile(_kind(mode))
    return handle


def read_regular_file(path: Path) -> bytes:
    """The bytes of ``path`` (see ``open_regular_file``)."""
    with open_regular_file(path) as handle:
        return handle.read()
