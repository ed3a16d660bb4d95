"""Docs that cannot drift: every column of every table is documented in docs/STORE.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stepscope.cli import COMMANDS
from stepscope.store.schema import SCHEMA_VERSION, TABLES

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize("table", list(TABLES))
def test_every_column_is_documented(table: str) -> None:
    text = (DOCS / "STORE.md").read_text()
    section = re.search(rf"### `{table}`.*?(?=\n### |\Z)", text, re.S)
    assert section, f"docs/STORE.md has no section for {table}"
    for column in TABLES[table].schema.names:
        assert re.search(rf"\b{column}\b", section.group(0)), f"{table}.{column} is not documented"


def test_store_doc_states_the_schema_version() -> None:
    assert f"Schema version: **{SCHEMA_VERSION}**" in (DOCS / "STORE.md").read_text()


def test_every_command_is_in_the_readme_or_docs() -> None:
    text = (DOCS.parent / "README.md").read_text() + "".join(p.read_text() for p in DOCS.glob("*.md"))
    for command in COMMANDS:
        assert f"stepscope {command}" in text, f"`stepscope {command}` is not documented"


def _store_doc_values(column: str) -> list[str]:
    row = re.search(rf"^\| {column} \| string \| `([^`]*)`", (DOCS / "STORE.md").read_text(), re.M)
    assert row, f"docs/STORE.md lists no values for events.{column}"
    return [v.strip() for v in row.group(1).split(",")]


def test_event_kinds_and_categories_are_the_documented_ones(tmp_path_factory: pytest.TempPathFactory) -> None:
    """schema.KINDS and schema.CATEGORIES are what docs/STORE.md lists and what ingest writes
    (every sample run, ingested once per test run for every test that reads them)."""
    from stepscope.store import open_store
    from stepscope.store.schema import CATEGORIES, KINDS
    from tests._dashboard_stores import build_sample_store

    assert _store_doc_values("kind") == list(KINDS)
    assert _store_doc_values("category") == list(CATEGORIES)
    with open_store(build_sample_store(tmp_path_factory)) as store:
        rows = store.sql("SELECT DISTINCT kind, category FROM events").to_pylist()
    assert {r["kind"] for r in rows} <= set(KINDS)
    assert {r["category"] for r in rows} - {None} <= set(CATEGORIES)


def test_every_decided_by_value_is_documented() -> None:
    from stepscope.analysis.compare.gate import DECIDED_BY

    text = (DOCS / "COMPARE_JSON.md").read_text()
    section = re.search(r"## `decided_by`.*?\n\n(.*?)\n\n", text, re.S)
    assert section
    assert re.findall(r"^\| `([^`]+)` \|", section.group(1), re.M) == list(DECIDED_BY)
