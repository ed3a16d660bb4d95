"""The project's own gloo DDP sample: CPU-side collectives typed from Input Dims / Input type."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "ddp-gloo-2ranks"


def test_gloo_collectives_sizes_and_dtypes(tmp_path: Path) -> None:
    report = ingest_paths([SAMPLE], tmp_path / "s", "ddp")
    assert report.ok and sorted(t.rank for t in report.stored) == [0, 1]
    raw = json.loads(gzip.decompress((SAMPLE / "rank0.pt.trace.json.gz").read_bytes()))["traceEvents"]
    def elements(first_input: list) -> int:  # one tensor [n, m] or a tensor list [[n, m], ...]
        shapes = first_input if first_input and isinstance(first_input[0], list) else [first_input]
        return sum(math.prod(shape) for shape in shapes)

    expected = sorted(
        (e["name"], elements(e["args"]["Input Dims"][0]))
        for e in raw if e.get("name") in ("c10d::allreduce_", "gloo:all_reduce")
    )
    rows = open_store(tmp_path / "s").sql(
        """SELECT name, in_nelems, dtype, bytes, collective FROM events
           WHERE rank = 0 AND name IN ('c10d::allreduce_', 'gloo:all_reduce') ORDER BY name, in_nelems"""
    ).to_pylist()
    assert [(r["name"], r["in_nelems"]) for r in rows] == expected
    assert {r["collective"] for r in rows} == {"all_reduce"}
    for r in rows:
        if r["name"] == "gloo:all_reduce":
            assert (r["dtype"], r["bytes"]) == ("float", r["in_nelems"] * 4)
        else:  # c10d::allreduce_ records only "TensorList" as its input type: dtype unknown.
            assert (r["dtype"], r["bytes"]) == (None, None)
