"""``rank_hiding_spans.before_ns``: each stretch's length-before, summed at ingest, against the
stretches themselves summed in Python."""

from __future__ import annotations

from collections.abc import Callable
from itertools import groupby
from pathlib import Path

import pytest

from stepscope.store import open_store


def _check_before(store_path: Path) -> int:
    """Assert every rank's ``before_ns`` is the sum of the lengths of its stretches before it
    (the stretches disjoint); return how many stretches were checked."""
    with open_store(store_path) as store:
        rows = store.sql("SELECT run, rank, s0, s1, before_ns FROM rank_hiding_spans ORDER BY run, rank, s0").to_pylist()
    for (run, rank), spans in groupby(rows, key=lambda r: (r["run"], r["rank"])):
        covered, end = 0, None
        for span in spans:
            assert end is None or span["s0"] >= end, (run, rank, span)
            assert span["before_ns"] == covered, (run, rank, span, covered)
            covered += span["s1"] - span["s0"]
            end = span["s1"]
    return len(rows)


def test_before_ns_sums_the_stretches_before_each_gpu(ingested: Callable[[str], Path]) -> None:
    """Real NCCL ranks, whose stretches are the compute kernels' union."""
    assert _check_before(ingested("hta/nccl_parser_config")) > 100


@pytest.mark.parametrize("run", ["gloo-3ranks-late", "ddp-gloo-2ranks"])
def test_before_ns_sums_the_stretches_before_each_host(sample_run: Callable[[str], Path], run: str) -> None:
    """Recorded CPU-only gloo ranks, whose stretches are the host work before communication."""
    assert _check_before(sample_run(run)) > 10
