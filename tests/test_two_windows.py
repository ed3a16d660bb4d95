"""Whole-trace totals of a rank profiled in two windows: taken within each window and added.

kineto's ``resnet50_num_workers_0`` sample (one process, two traces 470 s apart: steps 5-10 and
16-21) once read "gpu span 471 s, idle 99.7%": the gap between the windows counted as GPU time.
That folder is not among the shared traces, so the test builds it: a real trace and a copy of it
470 s later with its steps renumbered, both rank 0 of one run. The reference is plain Python over
the raw JSON (each file's GPU events: the span from the first start to the last end, and the
union of their intervals).
"""

from __future__ import annotations

import copy
import gzip
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis.breakdown import rank_totals
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from tests._intervals import length, load_trace, to_ns, union
from tests.conftest import write_trace

GAP_NS = 470_000_000_000
"""Between the two windows: the sample's 470 s."""
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
TRACE = "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"
"""A small real trace with GPU work in two steps, its ``ts`` relative to ``baseTimeNanoseconds``
(so the later window moves exactly, by its base)."""


def _later_window(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` recorded again ``GAP_NS`` later, its ProfilerStep#N numbered on from the last one."""
    out = copy.deepcopy(doc)
    out["baseTimeNanoseconds"] = int(doc["baseTimeNanoseconds"]) + GAP_NS
    names = [str(e.get("name", "")) for e in out["traceEvents"]]
    last = max(int(m.group(1)) for n in names if (m := re.match(r"ProfilerStep#(\d+)$", n)))
    for event in out["traceEvents"]:
        if (m := re.match(r"ProfilerStep#(\d+)$", str(event.get("name", "")))):
            event["name"] = f"ProfilerStep#{int(m.group(1)) + last + 5}"
    return out


def _gpu_figures(doc: dict[str, Any]) -> tuple[int, int]:
    """(span, busy) of one window's GPU events, in ns, from the raw JSON."""
    spans = [(to_ns(doc, e["ts"]), to_ns(doc, e["ts"]) + round(e["dur"] * 1000)) for e in doc["traceEvents"]
             if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES and e.get("dur", 0) > 0]
    return max(b for _, b in spans) - min(a for a, _ in spans), length(union(spans))


@pytest.mark.shared
def test_gpu_totals_never_span_the_gap_between_two_windows(shared_traces: Path, tmp_path: Path) -> None:
    source = shared_traces / TRACE
    doc, plain = load_trace(source), json.loads(gzip.decompress(source.read_bytes()))
    later = _later_window(plain)
    window1 = tmp_path / "t" / "rank0.window1.json.gz"
    window1.parent.mkdir(parents=True)
    shutil.copyfile(source, window1)
    window2 = write_trace(tmp_path / "t" / "rank0.window2.json", later["traceEvents"],
                          **{k: v for k, v in later.items() if k != "traceEvents"})
    report = ingest_paths([window1, window2], tmp_path / "s", "r")
    assert report.ok, report.errors
    store = open_store(tmp_path / "s")
    assert store.sql("SELECT count(DISTINCT rank) AS ranks, count(*) AS traces FROM sources WHERE run = 'r'"
                     ).to_pylist() == [{"ranks": 1, "traces": 2}]
    span, busy = _gpu_figures(doc)
    assert _gpu_figures({**doc, "baseTimeNanoseconds": int(doc["baseTimeNanoseconds"]) + GAP_NS}) == (span, busy)
    assert 0 < busy < span < 10_000_000_000  # under 10 s, against the 470 s gap
    [totals] = rank_totals(store, "r").to_pylist()
    assert totals["gpu_span_ns"] == 2 * span
    assert totals["gpu_busy_ns"] == 2 * busy
    assert totals["gpu_idle_ns"] == 2 * (span - busy)
