"""One error hierarchy for the whole tool: each error carries the exit code the CLI returns.

Library code raises these; only ``stepscope.cli`` turns them into messages and exit codes, so a
script embedding stepscope gets exceptions, never ``sys.exit``.
"""

from __future__ import annotations


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


class Inconclusive(StepscopeError):
    """Two runs cannot be compared fairly; the reason says why."""

    exit_code = 4
