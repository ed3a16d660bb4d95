"""The one table model (stepscope/render/table.py): the same rows to the terminal, Markdown, HTML."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pytest

from stepscope.render.table import Column, Table, to_html, to_markdown, to_terminal

TABLE = Table("Step times", (Column("rank", "count"), Column("name"), Column("median", "ns"), Column("peak", "bytes")),
              [(0, "a|b", 4_561_000, 1536), (12, "<x>", None, "mixed [cell]")], note="median per step")


def test_cells_are_formatted_by_their_column() -> None:
    assert TABLE.cells() == [["0", "a|b", "4.56 ms", "1.50 KiB"], ["12", "<x>", "n/a", "mixed [cell]"]]


def test_terminal_right_aligns_numbers_and_keeps_brackets() -> None:
    lines = to_terminal([TABLE], width=100).splitlines()
    assert lines[:3] == ["Step times", "==========", "median per step"]
    header, rule, first, second = lines[3:]
    assert header.split() == ["rank", "name", "median", "peak"] and set(rule) == {"-", " "}
    # Right-aligned: the last characters of the numbers line up under their header's end.
    assert first.index("0") + 1 == header.index("rank") + len("rank") == second.index("12") + 2
    assert first.index("4.56 ms") + len("4.56 ms") == header.index("median") + len("median")
    assert "mixed [cell]" in second  # rich markup is off: brackets are text


def test_a_narrow_terminal_never_cuts_a_number_or_a_word() -> None:
    """Twelve columns of long names on 80 columns (the demo's breakdown) once printed ``13…``:
    text wraps between words, and what still does not fit runs past the width."""
    wide = Table("parts", tuple(Column(f"communication_part_{i}_ms", "number") for i in range(12))
                 + (Column("note"),), [tuple(123456.789 + i for i in range(12)) + ("two words",)])
    text = to_terminal([wide], width=80)
    assert "…" not in text
    values = text.splitlines()[-1].split()
    assert values[:12] == [f"{123456.789 + i:,.3f}" for i in range(12)]
    assert all(f"communication_part_{i}_ms" in text for i in range(12))
    narrow = Table("t", (Column("text"), Column("n", "number")), [("a sentence that wraps between words", 1.5)])
    lines = to_terminal([narrow], width=20).splitlines()[4:]
    assert max(map(len, lines)) <= 20 and lines[0].split()[-1] == "1.500"  # fits by wrapping the text
    assert " ".join(" ".join(lines).replace("1.500", "").split()) == "a sentence that wraps between words"


def test_markdown_escapes_and_aligns() -> None:
    text = to_markdown(TABLE, level=2)
    assert text.splitlines() == [
        "## Step times", "", "_median per step_", "",
        "| rank | name | median | peak |", "|---:|---|---:|---:|",
        "| 0 | a\\|b | 4.56 ms | 1.50 KiB |", "| 12 | <x> | n/a | mixed [cell] |"]
    assert to_markdown(Table("Empty", (Column("a"),), note="nothing here")) == "### Empty\n\n_nothing here_\n"


def test_html_escapes() -> None:
    page = to_html(TABLE)
    assert "<td>&lt;x&gt;</td>" in page and '<td class="num">4.56 ms</td>' in page
    assert page.startswith("<h3>Step times</h3>")


def test_rows_must_fit_the_columns() -> None:
    with pytest.raises(ValueError, match="2 cells for 1 columns"):
        Table("t", (Column("a"),), [(1, 2)])
    with pytest.raises(ValueError, match="unknown unit"):
        Column("a", "furlongs")


def test_arrow_tables_keep_their_numbers() -> None:
    data = pa.table({"run": ["r"], "events": pa.array([Decimal(6676)], pa.decimal128(38, 0)), "ms": [1234.5678],
                     "tags": [[1, 2]]})
    table = Table.from_arrow(data)
    assert [c.unit for c in table.columns] == ["text", "number", "number", "text"]
    assert table.cells() == [["r", "6,676", "1,234.568", "[1, 2]"]]
