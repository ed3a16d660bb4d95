"""The stored ``args`` column: each event's args JSON exactly as recorded, null when absent."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from stepscope.store import open_store
from stepscope.store.convert import _args_column
from tests.conftest import load_raw


def test_args_column_keeps_text_and_nulls() -> None:
    raws = [msgspec.Raw(b'{"a": 1}'), msgspec.Raw(), msgspec.Raw('{"é": "∑"}'.encode()),
            msgspec.Raw(b"{}")]
    assert _args_column(raws).to_pylist() == ['{"a": 1}', None, '{"é": "∑"}', "{}"]
    assert _args_column([]).to_pylist() == []


@pytest.mark.shared
def test_stored_args_match_the_raw_json(ingested, shared_traces: Path) -> None:
    """Same multiset of args objects as json.loads reads from the file (events are re-sorted)."""
    relative = "hta/trace_diff/control"
    raw = load_raw(next((shared_traces / relative).glob("*.json.gz")))["traceEvents"]

    def canonical(args: object) -> str:
        return json.dumps(args, sort_keys=True)

    expected = Counter(canonical(e["args"]) for e in raw if "args" in e)
    stored = open_store(ingested(relative)).sql("SELECT args FROM events")["args"].to_pylist()
    assert sum(a is None for a in stored) == sum("args" not in e for e in raw)
    assert Counter(canonical(json.loads(a)) for a in stored if a is not None) == expected
