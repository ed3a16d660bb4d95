"""The suite's own set-up (tests/conftest.py): the serial pass of ``./setup.sh test`` imports
only the files that :data:`SERIAL_FILES` lists, so a ``serial`` marker anywhere else would
silently never run."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import SERIAL_FILES

TESTS = Path(__file__).resolve().parent
MARK = re.compile(r"pytest\.mark\.serial\b")


def test_serial_files_are_exactly_those_with_serial_tests() -> None:
    marked = {path.name for path in TESTS.glob("test_*.py") if MARK.search(path.read_text(encoding="utf-8"))}
    assert marked - {Path(__file__).name} == SERIAL_FILES
