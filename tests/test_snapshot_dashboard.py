"""The Memory page on a run holding a memory snapshot (Streamlit AppTest): the OOM first, in
words, with its cause and frames; the curve with the peak marked; the frames live at the peak;
the OOM's frames; the segments. Every figure shown is the analysis layer's, which
test_snapshot_analysis checks against a plain-Python replay of the pickle."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from stepscope.analysis.snapshot import snapshot_section, snapshot_segments
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from tests import _snapshots
from tests.test_dashboard_apptest import open_page, table_with

pytest.importorskip("streamlit.testing.v1")


@pytest.fixture(scope="module")
def oom_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("snapshot-dash")
    path = root / "rank-0.pickle"
    path.write_bytes(pickle.dumps(_snapshots.build("2.5", cpp=True, oom=True)))
    assert ingest_paths([path], root / "store", "oom").ok
    return root / "store"


def test_the_memory_page_says_what_ran_out_first(oom_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(oom_store, "memory", monkeypatch, run="oom")
    assert not at.exception, [e.value for e in at.exception]
    with open_store(oom_store) as store:
        [record] = snapshot_section(store, "oom", None).snapshots
        segments = snapshot_segments(store, "oom").to_pandas()
    # the first thing said: the OOM, its cause (64 MB asked, 14 + 6 MB free: live data) and who held the memory
    [oom] = [e.value for e in at.error]
    assert oom.startswith("rank 0 ran out of memory on device 0") and "live data" in oom
    assert "train.py:40 (train_step)" in oom
    head = table_with(at, "peak_allocated_bytes", "reserved_bytes", "segments")
    assert head.iloc[0]["peak_allocated_bytes"] == record["peak_allocated_bytes"] == 11 * _snapshots.MB
    assert head.iloc[0]["segments"] == record["reserved"]["segments"] == 1
    live = table_with(at, "frame", "bytes", "allocations")
    assert list(live["frame"]) == [g["frame"] for g in record["live_at_peak"]]
    assert list(live["bytes"]) == [g["bytes"] for g in record["live_at_peak"]]
    oom_row = table_with(at, "request_bytes", "cause")
    assert (oom_row.iloc[0]["request_bytes"], oom_row.iloc[0]["cause"]) == (64 * _snapshots.MB, "live data")
    shown = table_with(at, "reserved_bytes", "free_bytes", "largest_free_block_bytes")
    assert list(shown["reserved_bytes"]) == list(segments["reserved_bytes"]) == [20 * _snapshots.MB]
    assert list(shown["free_bytes"]) == [14 * _snapshots.MB]  # by hand: 20 MB reserved, B 2 + C 4 allocated
    assert len(at.get("vega_lite_chart")) == 4  # curve, live at the peak, live at the OOM, segments


def test_a_real_snapshot_on_the_memory_page(tmp_path: Path, shared_traces: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = shared_traces / "memsnap" / "magma27_cs336" / "memory_snapshot.pickle"
    assert ingest_paths([path], tmp_path / "store", "magma").ok
    at = open_page(tmp_path / "store", "memory", monkeypatch, run="magma")
    assert not at.exception and not at.error, [e.value for e in (*at.exception, *at.error)]
    with open_store(tmp_path / "store") as store:
        [record] = snapshot_section(store, "magma", None).snapshots
    assert table_with(at, "peak_allocated_bytes").iloc[0]["peak_allocated_bytes"] == record["peak_allocated_bytes"]
    assert any("activations" in i.value for i in at.info)  # memory.activations: most of the peak
    assert len(at.get("vega_lite_chart")) == 3  # curve, live at the peak, segments
