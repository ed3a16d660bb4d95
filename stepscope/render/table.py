"""One table model: a titled list of rows under typed columns, rendered three ways.

Every table stepscope prints (the summary, the comparison, ``runs`` and ``sql`` results, the
HTML report) is a :class:`Table`, so the terminal, Markdown and HTML show the same rows with the
same figures::

    table = Table("Step times", (Column("rank", "count"), Column("median", "ns")), [(0, 4.56e6)])
    to_terminal([table])   # aligned text (rich), numbers right-aligned
    to_markdown(table)     # a GitHub-flavoured Markdown table under a ### heading
    to_html(table)         # <h3> + <table>, escaped

A column's ``unit`` names its formatter in :mod:`stepscope.units` (``ns``, ``bytes``,
``gbps``, ``pct``, ``count``, ``number``, ``text``...); a cell holds the raw value and is formatted
by its column, except a ``str``, which is shown as it is (for mixed cells such as
``4.56 ms [4.50 ms-4.70 ms]``) and ``None``, shown as ``n/a``. Numeric columns (any unit but
``text``) are right-aligned. Renderers are pure: table in, string out.
"""

from __future__ import annotations

import html
import io
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from stepscope.units import FORMATTERS, MISSING

if TYPE_CHECKING:
    import pyarrow as pa

TERMINAL_WIDTH = 160
"""Width of terminal output when stdout is not a terminal (CI logs, files): wide enough that the
comparison's tables do not wrap."""

UNLIMITED_WIDTH = 1_000_000
"""The width a table gets when it cannot fit the terminal's even with its text wrapped: its own."""


@dataclass(frozen=True)
class Column:
    """A column: its header and the unit its values are in (a key of ``units.FORMATTERS``)."""

    header: str
    unit: str = "text"

    def __post_init__(self) -> None:
        if self.unit not in FORMATTERS:
            raise ValueError(f"column {self.header!r}: unknown unit {self.unit!r} (known: {', '.join(FORMATTERS)})")

    @property
    def numeric(self) -> bool:
        """Numbers are right-aligned; text is left-aligned."""
        return self.unit != "text"

    def format(self, value: Any) -> str:
        """The cell's text: ``n/a`` for None, a ``str`` as it is, else the unit's formatter."""
        if value is None:
            return MISSING
        if isinstance(value, str):
            return value
        return FORMATTERS[self.unit](value)


@dataclass(frozen=True)
class Table:
    """A titled table. ``rows`` hold raw values, one per column; ``note`` is shown under the title
    (what the figures are, or why there are no rows)."""

    title: str
    columns: tuple[Column, ...]
    rows: Sequence[Sequence[Any]] = field(default_factory=tuple)
    note: str | None = None

    def __post_init__(self) -> None:
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(f"table {self.title!r}: a row has {len(row)} cells for {len(self.columns)} columns")

    @classmethod
    def of_text(cls, title: str, headers: Iterable[str], rows: Sequence[Sequence[Any]],
                note: str | None = None) -> Table:
        """A table whose columns are all text (cells already formatted)."""
        return cls(title, tuple(Column(h) for h in headers), rows, note)

    @classmethod
    def from_arrow(cls, data: pa.Table, title: str = "", note: str | None = None) -> Table:
        """An Arrow table: integer and floating columns become ``number`` columns, the rest text
        (shown with ``str``)."""
        import pyarrow as pa

        def unit(kind: pa.DataType) -> str:
            numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)
            return "number" if numeric else "text"

        columns = tuple(Column(f.name, unit(f.type)) for f in data.schema)
        rows = [tuple(_plain(v) for v in row.values()) for row in data.to_pylist()]
        return cls(title, columns, rows, note)

    @property
    def headers(self) -> list[str]:
        return [c.header for c in self.columns]

    def cells(self) -> list[list[str]]:
        """Every row as text, each cell formatted by its column."""
        return [[c.format(v) for c, v in zip(self.columns, row)] for row in self.rows]


def _plain(value: Any) -> Any:
    """Numbers (decimals too: DuckDB's ``sum`` of integers) and None as they are, the rest
    (lists, dicts, timestamps, booleans) as text."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if value is None or isinstance(value, (int, float, str)) and not isinstance(value, bool):
        return value
    return str(value)


# ---- terminal ----

def terminal_width() -> int:
    """The terminal's width, or :data:`TERMINAL_WIDTH` when stdout is not a terminal."""
    return shutil.get_terminal_size((TERMINAL_WIDTH, 24)).columns


def narrowest(table: Table) -> int:
    """The least width ``table`` takes without losing a character: numbers whole, text wrapped
    only between words (each column is as wide as its longest number or word, plus its padding
    and the divider: three characters)."""

    def least(column: Column, cells: list[str]) -> int:
        words = [column.header, *cells] if column.numeric else (column.header + " " + " ".join(cells)).split()
        return max((len(w) for w in words), default=0)

    cells = table.cells()
    return sum(least(c, [row[i] for row in cells]) + 3 for i, c in enumerate(table.columns))


def to_terminal(tables: Iterable[Table], width: int | None = None) -> str:
    """Aligned plain text (no colour, ASCII rules), one table after another: title, ``=`` rule,
    note, header, ``-`` rule, rows. Text cells wrap between words when the tables are wider than
    ``width``; a table that cannot fit even so runs past ``width`` rather than cut a number or a
    word short (a truncated figure misleads; a long line only wraps)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table as RichTable
    from rich.text import Text

    rule = box.Box("    \n    \n -  \n    \n    \n -  \n    \n    \n", ascii=True)
    width = width or TERMINAL_WIDTH
    console = Console(file=io.StringIO(), width=width, color_system=None, highlight=False,
                      emoji=False, markup=False, legacy_windows=False, soft_wrap=False)
    first = True
    for table in tables:
        if not first:
            console.print()
        first = False
        if table.title:
            console.print(Text(table.title))
            console.print(Text("=" * len(table.title)))
        if table.note:
            console.print(Text(table.note))
        if not table.rows:
            continue
        console.width = width if narrowest(table) <= width else UNLIMITED_WIDTH
        out = RichTable(box=rule, show_edge=False, pad_edge=False, padding=(0, 1), header_style="")
        for column in table.columns:
            out.add_column(Text(column.header), justify="right" if column.numeric else "left",
                           no_wrap=column.numeric)
        for row in table.cells():
            out.add_row(*(Text(cell) for cell in row))
        console.print(out)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    return "\n".join(line.rstrip() for line in text.splitlines())


# ---- Markdown ----

def md_escape(text: str) -> str:
    """Text safe inside a Markdown table cell or list item: pipes escaped, one line."""
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(table: Table, level: int = 3) -> str:
    """A heading (``level`` #s), the note in italics, then a GitHub-flavoured table with numeric
    columns right-aligned. A table without rows is its heading and note only."""
    out = []
    if table.title:
        out += [f"{'#' * level} {md_escape(table.title)}", ""]
    if table.note:
        out += [f"_{md_escape(table.note)}_", ""]
    if table.rows:
        out.append("| " + " | ".join(md_escape(h) for h in table.headers) + " |")
        out.append("|" + "|".join("---:" if c.numeric else "---" for c in table.columns) + "|")
        out += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in table.cells()]
    return "\n".join(out).rstrip() + "\n"


# ---- HTML ----

def to_html(table: Table, level: int = 3) -> str:
    """An ``<h{level}>`` title, the note, and an escaped ``<table>``; numeric cells carry
    ``class="num"`` (right-aligned by the page's style)."""
    def cell(tag: str, text: str, column: Column) -> str:
        klass = ' class="num"' if column.numeric else ""
        return f"<{tag}{klass}>{html.escape(text)}</{tag}>"

    out = f"<h{level}>{html.escape(table.title)}</h{level}>" if table.title else ""
    if table.note:
        out += f'<p class="note">{html.escape(table.note)}</p>'
    if table.rows:
        head = "".join(cell("th", h, c) for h, c in zip(table.headers, table.columns))
        body = "".join("<tr>" + "".join(cell("td", v, c) for v, c in zip(row, table.columns)) + "</tr>"
                       for row in table.cells())
        out += f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    return out
