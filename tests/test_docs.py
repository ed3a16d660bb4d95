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
