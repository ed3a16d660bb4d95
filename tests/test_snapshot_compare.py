"""``stepscope compare`` on two runs holding memory snapshots: the peak, the reserved memory and
the user frames whose live bytes at the peak moved most, in JSON, text and Markdown; every figure
checked against the plain-Python replay of the pickles (``replay`` in test_snapshot_analysis,
which shares no code with stepscope)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

from stepscope.analysis.compare import compare_runs
from stepscope.analysis.compare.gate import verdict
from stepscope.analysis.compare.snapshots import TOP_FRAMES, compare_snapshots
from stepscope.render.compare_json import render_json
from stepscope.render.compare_markdown import render_markdown
from stepscope.render.compare_text import render_text
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from stepscope.store.snapshot.unpickle import load_snapshot
from tests import _snapshots
from tests.test_snapshot_analysis import replay

MB = _snapshots.MB


def _store(tmp_path: Path, base: Path, cand: Path) -> Path:
    store = tmp_path / "store"
    assert ingest_paths([base], store, "base").ok and ingest_paths([cand], store, "cand").ok
    return store


def _expected(base: dict[str, Any], cand: dict[str, Any]) -> dict[str, Any]:
    """The pair as the replay sees it: peaks, reserved at the peak, and the frames' moves."""
    b, c = replay(base, top=10**9), replay(cand, top=10**9)
    bf, cf = b["peak"]["by_frame"], c["peak"]["by_frame"]
    moves = {f: cf.get(f, 0) - bf.get(f, 0) for f in bf.keys() | cf.keys()}
    top = sorted(((f, d) for f, d in moves.items() if d), key=lambda kv: (-abs(kv[1]), kv[0]))[:TOP_FRAMES]
    return {"peak": (b["peak"]["allocated"], c["peak"]["allocated"]),
            "reserved_at_peak": (b["peak"]["reserved"], c["peak"]["reserved"]),
            "reserved": (b["reserved_end"], c["reserved_end"]),
            "frames": [(f, bf.get(f, 0), cf.get(f, 0), d) for f, d in top]}


def _check(pair: dict[str, Any], expected: dict[str, Any]) -> None:
    for key, figure in (("peak", "peak_allocated_bytes"), ("reserved_at_peak", "reserved_at_peak_bytes"),
                        ("reserved", "reserved_bytes")):
        base, cand = expected[key]
        assert (pair[figure]["baseline"], pair[figure]["candidate"], pair[figure]["delta"]) == (base, cand, cand - base)
    assert [(f["frame"], f["baseline_bytes"], f["candidate_bytes"], f["delta_bytes"]) for f in pair["frames"]] == \
        expected["frames"]


def test_two_real_snapshots_against_the_replay(tmp_path: Path, shared_traces: Path) -> None:
    base_path = shared_traces / "memsnap" / "magma27_cs336" / "memory_snapshot.pickle"
    cand_path = shared_traces / "memsnap" / "bcrafton_cs336" / "memory_snapshot.pickle"
    store = open_store(_store(tmp_path, base_path, cand_path))
    result = compare_snapshots([(store, "base")], [(store, "cand")])
    [pair] = result["pairs"]
    assert (pair["rank"], pair["device"], result["unpaired"], result["several_snapshots"]) == (0, 0, [], [])
    _check(pair, _expected(load_snapshot(base_path), load_snapshot(cand_path)))
    # the renderers show the same figures: JSON as is, text and Markdown as tables
    comparison = compare_runs(store, "base", store, "cand")
    judged = verdict(comparison, [])
    assert json.loads(render_json(comparison, judged))["snapshots"]["pairs"][0]["frames"] == pair["frames"]
    for text in (render_text(comparison, judged, width=200), render_markdown(comparison, judged)):
        assert "Memory snapshot, rank 0 device 0" in text and "Frames live at the peak" in text
        assert pair["frames"][0]["frame"] in text


def test_a_built_change_known_by_hand(tmp_path: Path) -> None:
    """The candidate's forward allocation A grows from 8 to 12 MB: the peak and model.py:30
    move by 4 MB, nothing else does."""
    base = _snapshots.build("2.5", cpp=True)
    cand = _snapshots.build("2.5", cpp=True)
    a = cand["device_traces"][0][1]["addr"]
    for entry in cand["device_traces"][0]:
        if entry["addr"] == a and entry["action"] in ("alloc", "free_requested", "free_completed"):
            entry["size"] = 12 * MB
    paths = []
    for name, snapshot in (("base", base), ("cand", cand)):
        paths.append(tmp_path / f"{name}.pickle")
        paths[-1].write_bytes(pickle.dumps(snapshot))
    store = open_store(_store(tmp_path, *paths))
    [pair] = compare_snapshots([(store, "base")], [(store, "cand")])["pairs"]
    _check(pair, _expected(base, cand))
    assert pair["peak_allocated_bytes"] | {"delta_pct": None} == {
        "baseline": 11 * MB, "candidate": 15 * MB, "delta": 4 * MB, "delta_pct": None}
    assert pair["frames"] == [{"frame": "model.py:30 (attention)", "baseline_bytes": 8 * MB,
                               "candidate_bytes": 12 * MB, "delta_bytes": 4 * MB}]


def test_a_rank_only_one_side_holds_is_unpaired_not_compared_with_0(tmp_path: Path) -> None:
    base, cand = tmp_path / "rank-0.pickle", tmp_path / "rank-1.pickle"
    base.write_bytes(pickle.dumps(_snapshots.build("2.5")))
    cand.write_bytes(pickle.dumps(_snapshots.build("2.5", oom=True)))
    store = open_store(_store(tmp_path, base, cand))
    result = compare_snapshots([(store, "base")], [(store, "cand")])
    assert result["pairs"] == []
    assert result["unpaired"] == [{"side": "baseline", "rank": 0, "device": 0},
                                  {"side": "candidate", "rank": 1, "device": 0}]
