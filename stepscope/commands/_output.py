"""Render Arrow tables for the terminal (aligned text), for scripts (CSV) and JSON.

Pure functions from a table to a string; the commands decide where it goes. The terminal form
is the one table model's (:mod:`stepscope.render.table`).
"""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.csv as pacsv

from stepscope.render.table import Table, terminal_width, to_terminal

FORMATS = ("table", "csv", "json")


def to_text(table: pa.Table) -> str:
    """An aligned plain-text table; numbers right-aligned with thousands separators."""
    return to_terminal([Table.from_arrow(table)], terminal_width())


def to_csv(table: pa.Table) -> str:
    buffer = io.BytesIO()
    pacsv.write_csv(table, buffer)
    return buffer.getvalue().decode()


def to_json(table: pa.Table) -> str:
    return json.dumps(table.to_pylist(), default=str, indent=1)


def render(table: pa.Table, fmt: str) -> str:
    return {"table": to_text, "csv": to_csv, "json": to_json}[fmt](table)
