"""One error hierarchy for the whole tool: each error carries the exit code the CLI returns.

Library code raises these; only ``stepscope.cli`` turns them into messages and exit codes, so a
script embedding stepscope gets exceptions, never ``sys.exit``. Whose fault it is decides the
class: :class:`UsageError` only for what the user typed (a flag, a run or baseline name, their
own SQL), :class:`TraceFormatError`/:class:`StoreError` for input that cannot be read, and
:class:`InternalError` (or any exception stepscope did not expect) for stepscope's own failures,
such as an analysis query that fails or an integrity check inside one.
"""

from __future__ import annotations

import errno


class StepscopeError(Exception):
    """Base of every error stepscope raises on purpose. ``exit_code`` is what the CLI returns."""

    exit_code = 1


class UsageError(StepscopeError):
    """The command was called wrongly (bad flag value, unknown run, missing store)."""

    exit_code = 2


class TraceFormatError(StepscopeError):
    """An input file is not a readable Kineto trace. The message starts with the file's name."""

    exit_code = 3

    def __init__(self, path: object, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


class StoreError(StepscopeError):
    """The store is missing, unreadable, or written by a newer stepscope."""

    exit_code = 3


WRITE_PROBLEMS: dict[int, str] = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk full",
    errno.EFBIG: "disk full",
    errno.EROFS: "store not writable",
    errno.EACCES: "store not writable",
    errno.EPERM: "store not writable",
    errno.ENOTDIR: "store not writable",
    errno.EEXIST: "store not writable",
}
"""What an ``OSError`` met while writing the store means to the user, by errno: one class per
cause, so that the collector warns once per class and the CLI says the same words.
(``ENOTDIR``/``EEXIST``: a part of the store's path is a file.)"""


def write_problem(exc: BaseException) -> str:
    """The cause class of a failed write: "disk full", "store not writable", else "write failed"."""
    return WRITE_PROBLEMS.get(getattr(exc, "errno", None) or -1, "write failed")


def os_error_text(exc: OSError) -> str:
    """``<ExceptionType>: <strerror>``, without the file name (often a temporary one)."""
    return f"{type(exc).__name__}: {exc.strerror or exc}"


class StoreWriteError(StoreError):
    """Writing an input into the store failed (disk full, read-only, permissions): the store's
    problem, not the input's. The message is ``<file>: not stored: <cause> in <store> (...)``."""

    def __init__(self, path: object, store: object, exc: OSError) -> None:
        self.problem = write_problem(exc)
        self.errno = exc.errno
        self.strerror = exc.strerror
        self.detail = os_error_text(exc)
        super().__init__(f"{path}: not stored: {self.problem} in {store} ({self.detail})")


class Inconclusive(StepscopeError):
    """Two runs cannot be compared fairly; the reason says why."""

    exit_code = 4


class InternalError(StepscopeError):
    """stepscope itself failed (a query of an analysis, one of its integrity checks): a bug to
    report, not something the user typed. The CLI prints ``internal error: ...`` and, with
    ``--debug`` or ``STEPSCOPE_DEBUG=1``, the traceback; any unexpected exception is treated alike."""

    exit_code = 5


EXIT_CODES: dict[int, str] = {
    0: "success; for `compare`: within budget (or no baseline yet, with the default `--missing-baseline pass`)",
    StepscopeError.exit_code: "regression: a budget was exceeded by more than the run-to-run noise",
    UsageError.exit_code: "usage error: a flag, a name or SQL that the user typed is wrong",
    TraceFormatError.exit_code: "bad input: a trace file or the store cannot be read or written (the message names the file)",
    Inconclusive.exit_code: "inconclusive: the runs cannot be compared fairly, or a change is within the noise of its budget (the reasons are printed)",
    InternalError.exit_code: "internal error: stepscope failed; `--debug` or `STEPSCOPE_DEBUG=1` shows the traceback",
}
"""Every exit code of the ``stepscope`` command and what it means (documented in docs/ci.md and
checked against it by tests/test_cli_errors.py)."""
