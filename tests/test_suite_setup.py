"""The suite's own set-up (tests/conftest.py): the helpers that assemble the tests' stores."""

from __future__ import annotations

import json
import re
from pathlib import Path


def test_a_copied_run_is_what_ingesting_it_writes(sample_run, tmp_path: Path) -> None:
    """:func:`tests.conftest.copy_run` (how the dashboard tests' store of every sample run is
    assembled) gives, file for file, the store that ingesting the same runs into one store does,
    also under a name of the test's own (``as_run``)."""
    import pyarrow.parquet as pq

    from stepscope.store.ingest import ingest_paths
    from tests.conftest import REPO, copy_run

    runs = {"gloo-3ranks-even": "gloo-3ranks-even", "gloo-3ranks-late": "late"}  # sample -> run name
    copied, ingested = tmp_path / "copied", tmp_path / "ingested"
    for sample, run in runs.items():
        copy_run(sample_run(sample), copied, sample, as_run=run)
        assert ingest_paths([REPO / "sample_traces" / sample], ingested, run).ok

    def files(store: Path) -> dict[str, Path]:
        """Relative name -> file, the compacted files' random token left out of the name."""
        out = {}
        for path in store.rglob("*"):
            name = path.relative_to(store).as_posix()
            if path.is_file() and not name.startswith("cache/"):
                out[re.sub(r"^(\.compact/.*)-[0-9a-f]{16}\.parquet$", r"\1.parquet", name)] = path
        return out

    copies, ingests = files(copied), files(ingested)
    assert sorted(copies) == sorted(ingests)
    assert any(name.startswith(".compact/") for name in ingests)
    for name, path in ingests.items():
        if name.endswith(".parquet"):  # the same rows (a compacted file's in any order) and
            mine, theirs = pq.read_table(copies[name]), pq.read_table(path)  # types, but when
            if "ingested_at" in theirs.column_names:  # each trace was ingested
                mine, theirs = mine.drop_columns("ingested_at"), theirs.drop_columns("ingested_at")
            assert mine.schema.equals(theirs.schema), name
            assert sorted(map(repr, mine.to_pylist())) == sorted(map(repr, theirs.to_pylist())), name
        elif name.endswith("manifest.json"):  # the same tables, made from the same parts
            mine, theirs = json.loads(copies[name].read_text()), json.loads(path.read_text())
            assert sorted(mine["tables"]) == sorted(theirs["tables"])
            assert [p[:3] for p in mine["parts"]] == [p[:3] for p in theirs["parts"]]
        else:
            assert copies[name].read_bytes() == path.read_bytes(), name
