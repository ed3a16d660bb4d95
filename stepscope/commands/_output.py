"""Render Arrow tables for the terminal (aligned text), for scripts (CSV) and JSON.

Pure functions from a table to a string; the commands decide where it goes.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv

from stepscope.render.units import number

FORMATS = ("table", "csv", "json")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return number(value)
    return str(value)


def to_text(table: pa.Table, max_width: int = 60) -> str:
    """An aligned plain-text table; numbers right-aligned with thousands separators."""
    names = table.column_names
    rows = [[_cell(v)[:max_width] for v in row.values()] for row in table.to_pylist()]
    numeric = [pa.types.is_integer(t) or pa.types.is_floating(t) for t in table.schema.types]
    widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if num else c.ljust(w)
                         for c, w, num in zip(cells, widths, numeric)).rstrip()

    out = [line(names), line(["-" * w for w in widths])]
    out.extend(line(r) for r in rows)
    return "\n".join(out)


def to_csv(table: pa.Table) -> str:
    buffer = io.BytesIO()
    pacsv.write_csv(table, buffer)
    return buffer.getvalue().decode()


def to_json(table: pa.Table) -> str:
    return json.dumps(table.to_pylist(), default=str, indent=1)


def render(table: pa.Table, fmt: str) -> str:
    return {"table": to_text, "csv": to_csv, "json": to_json}[fmt](table)
