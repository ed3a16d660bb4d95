"""What filled the memory (the ``snapshot`` section, ``memory.oom``/``fragmentation``/``activations``),
every figure checked against a plain-Python replay of the same pickle (``replay`` below, which
shares no code with stepscope): built snapshots with known answers, a history cut as a ring
buffer cuts it, and the two real snapshots."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis.findings import RULES, evaluate
from stepscope.analysis.snapshot import BEFORE_HISTORY, snapshot_section
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from stepscope.store.snapshot.unpickle import load_snapshot
from tests import _snapshots

MB = _snapshots.MB


def _user_frame(frames: list[dict[str, Any]]) -> str:
    """The innermost frame that is Python, outside torch and the standard library."""
    for f in frames:
        path = f["filename"].replace("\\", "/")
        stdlib = "/lib/python" in path.lower() and "-packages/" not in path
        if path.endswith(".py") and "/torch/" not in path and not stdlib:
            return f"{path.rsplit('/', 1)[-1]}:{f['line']} ({f['name']})"
    return "(no frame outside torch and the standard library)" if frames else "(no stack recorded)"


def replay(snapshot: dict[str, Any], device: int = 0, top: int = 10) -> dict[str, Any]:
    """Walk one device's history: allocated and reserved after each event, the peak, and what
    is live at the peak and at the first oom, by user frame (the ``top`` largest, the rest as one)."""
    entries = snapshot["device_traces"][device]
    segments = [s for s in snapshot["segments"] if s["device"] == device]
    allocated_end = sum(b["size"] for s in segments for b in s["blocks"] if b["state"] != "inactive")
    reserved_end = sum(s["total_size"] for s in segments)
    grow = {"alloc": 1, "free_completed": -1}
    seg = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
    allocated = allocated_end - sum(grow.get(e["action"], 0) * e["size"] for e in entries)
    reserved = reserved_end - sum(seg.get(e["action"], 0) * e["size"] for e in entries)
    live: dict[int, tuple[int, str]] = {}
    out: dict[str, Any] = {"peak": None, "oom": None}
    for seq, e in enumerate(entries):
        allocated += grow.get(e["action"], 0) * e["size"]
        reserved += seg.get(e["action"], 0) * e["size"]
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], _user_frame(e["frames"]))
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
        moment = {"seq": seq, "allocated": allocated, "reserved": reserved, "by_frame": _by_frame(live, allocated, top)}
        if out["peak"] is None or allocated > out["peak"]["allocated"]:
            out["peak"] = moment
        if e["action"] == "oom" and out["oom"] is None:
            out["oom"] = {**moment, "request": e["size"], "device_free": e["addr"]}
    out["reserved_end"], out["allocated_end"] = reserved_end, allocated_end
    return out


def _backward(frame: dict[str, Any]) -> bool:
    """torch's autograd engine, or a ``backward`` of torch (``Tensor.backward``, ``autograd.backward``)."""
    name, path = frame.get("name") or "", (frame.get("filename") or "").replace("\\", "/")
    return name.startswith("torch::autograd::Engine::") or (name in ("backward", "_engine_run_backward")
                                                             and "/torch/" in path)


def activations(snapshot: dict[str, Any], peak_seq: int, device: int = 0) -> dict[str, int] | None:
    """Bytes live at ``peak_seq`` allocated with a stack free of backward frames and freed while
    the latest event with a stack had a backward frame, by user frame (``_by_frame``); None when no stack of the
    history has a backward frame (the backward cannot be told)."""
    entries = snapshot["device_traces"][device]
    if not any(_backward(f) for e in entries for f in e.get("frames") or []):
        return None
    phase, in_backward = False, []
    for e in entries:
        if e.get("frames"):
            phase = any(_backward(f) for f in e["frames"])
        in_backward.append(phase)
    held: dict[int, tuple[int, str]] = {}
    for seq, e in enumerate(entries[:peak_seq + 1]):
        if e["action"] != "alloc" or not e.get("frames") or any(_backward(f) for f in e["frames"]):
            continue
        freed = next((later for later in range(seq + 1, len(entries)) if entries[later]["addr"] == e["addr"]
                      and entries[later]["action"] in ("alloc", "free_completed")), None)
        if freed is not None and freed > peak_seq and in_backward[freed]:
            held[seq] = (e["size"], _user_frame(e["frames"]))
    return _by_frame(held, sum(size for size, _ in held.values()))


def _by_frame(live: dict[int, tuple[int, str]], allocated: int, top: int = 10) -> dict[str, int]:
    """Bytes by frame, the ``top`` largest and the rest as one, plus what was there before."""
    sums: dict[str, int] = {}
    for size, frame in live.values():
        sums[frame] = sums.get(frame, 0) + size
    ordered = sorted(sums.items(), key=lambda kv: (-kv[1], kv[0]))
    out = dict(ordered[:top])
    if ordered[top:]:
        out[f"({len(ordered) - top} other frames)"] = sum(v for _, v in ordered[top:])
    before = allocated - sum(sums.values())
    return {**out, **({BEFORE_HISTORY: before} if before else {})}


def _section(tmp_path: Path, snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    assert ingest_paths([path], tmp_path / "store", "r").ok
    result = snapshot_section(open_store(tmp_path / "store"), "r", None)
    return list(result.snapshots)


def _frames(groups: list[dict[str, Any]]) -> dict[str, int]:
    return {g["frame"]: g["bytes"] for g in groups}


def _check(record: dict[str, Any], expected: dict[str, Any]) -> None:
    peak = expected["peak"]
    assert (record["peak_allocated_bytes"], record["peak_seq"], record["reserved_at_peak_bytes"]) == (
        peak["allocated"], peak["seq"], peak["reserved"])
    assert _frames(record["live_at_peak"]) == peak["by_frame"]
    assert record["reserved"]["reserved_bytes"] == expected["reserved_end"]
    assert record["reserved"]["allocated_bytes"] == expected["allocated_end"]
    assert max(b["allocated_max"] for b in record["curve"]) == peak["allocated"]  # the peak is on the curve


def test_a_built_snapshot_peak_live_frames_and_activations(tmp_path: Path) -> None:
    snapshot = _snapshots.build("2.5", cpp=True)
    [record] = _section(tmp_path, snapshot)
    expected = replay(snapshot)
    _check(record, expected)
    # by hand: A 8 MB + B 2 MB + G 1 MB live after G's alloc; A (forward) is freed in the backward
    assert (record["peak_allocated_bytes"], record["peak_seq"]) == (11 * MB, 3)
    assert _frames(record["live_at_peak"]) == {"model.py:30 (attention)": 8 * MB, "train.py:40 (train_step)": 2 * MB,
                                              "train.py:44 (train_step)": 1 * MB}
    assert record["activations_at_peak"] == {"bytes": 8 * MB, "by_frame": [
        {"frame": "model.py:30 (attention)", "bytes": 8 * MB, "allocations": 1}]}
    assert record["reserved"] | {"basis": None} == {
        "basis": None, "reserved_bytes": 20 * MB, "allocated_bytes": 6 * MB, "reserved_unallocated_bytes": 14 * MB,
        "segments": 1, "largest_free_block_bytes": 8 * MB, "failed_request_bytes": None,
        "absent_reasons": {"failed_request_bytes": "the history holds no oom event"}}
    assert record["oom"] is None and "oom" in record["absent_reasons"]
    found = evaluate({"snapshot": snapshot_section(open_store(tmp_path / "store"), "r", None)},
                     [RULES["memory.activations"], RULES["memory.oom"]])
    assert [f.rule for f in found] == ["memory.activations"] and found[0].evidence["bytes"] == 8 * MB


def test_a_history_cut_by_the_ring_buffer_keeps_what_was_there_before(tmp_path: Path) -> None:
    snapshot = _snapshots.build("2.1")
    snapshot["device_traces"][0] = snapshot["device_traces"][0][2:]  # begins after the segment and A
    [record] = _section(tmp_path, snapshot)
    expected = replay(snapshot)
    _check(record, expected)
    # by hand: A (8 MB) was allocated before the history; B and G come on top of it
    assert (record["peak_allocated_bytes"], record["peak_seq"]) == (11 * MB, 1)
    assert _frames(record["live_at_peak"]) == {BEFORE_HISTORY: 8 * MB, "train.py:40 (train_step)": 2 * MB,
                                              "train.py:44 (train_step)": 1 * MB}


@pytest.mark.parametrize(("request_bytes", "cause"), [(64 * MB, "live data"), (16 * MB, "fragmentation")])
def test_an_oom_is_the_first_finding_with_its_cause(tmp_path: Path, request_bytes: int, cause: str) -> None:
    snapshot = _snapshots.build("2.5", oom=True, oom_request=request_bytes)
    [record] = _section(tmp_path, snapshot)
    expected = replay(snapshot)
    _check(record, expected)
    oom = record["oom"]
    # by hand: 6 MB allocated of 20 MB reserved, 6 MB free on the device: 14 + 6 = 20 MB free in all
    assert (oom["request_bytes"], oom["allocated_bytes"], oom["reserved_bytes"], oom["device_free_bytes"]) == (
        request_bytes, expected["oom"]["allocated"], expected["oom"]["reserved"], 6 * MB)
    assert oom["cause"] == cause and _frames(oom["live_by_frame"]) == expected["oom"]["by_frame"]
    found = evaluate({"snapshot": snapshot_section(open_store(tmp_path / "store"), "r", None)},
                     [RULES[r] for r in ("memory.activations", "memory.fragmentation", "memory.oom")])
    assert found[0].rule == "memory.oom" and found[0].evidence["cause"] == cause
    assert cause in found[0].message and "train.py:40 (train_step)" in found[0].message


def test_several_devices_each_their_own(tmp_path: Path) -> None:
    snapshot = _snapshots.build("2.1", devices=2)
    records = _section(tmp_path, snapshot)
    assert [r["device"] for r in records] == [0, 1]
    for record in records:
        _check(record, replay(snapshot, record["device"]))


@pytest.mark.parametrize("name", ["magma27_cs336", "bcrafton_cs336"])
def test_real_snapshots_against_the_replay(tmp_path: Path, shared_traces: Path, name: str) -> None:
    path = shared_traces / "memsnap" / name / "memory_snapshot.pickle"
    assert ingest_paths([path], tmp_path / "store", "r").ok
    [record] = snapshot_section(open_store(tmp_path / "store"), "r", None).snapshots
    snapshot = load_snapshot(path)
    _check(record, replay(snapshot))
    expected = activations(snapshot, record["peak_seq"])
    assert expected is not None  # both record a backward frame
    assert record["activations_at_peak"]["bytes"] == sum(expected.values())
    assert {g["frame"]: g["bytes"] for g in record["activations_at_peak"]["by_frame"]} == expected


def test_activations_on_the_real_snapshots_as_read_by_hand(tmp_path: Path, shared_traces: Path) -> None:
    """Why each real snapshot has the activations it has (read from the raw pickles).
    magma27 (Python-only stacks): the peak is the end of the forward (event 1402; ``loss.backward()``
    is first seen at 1418), and the backward's allocations and frees carry no stack (the autograd
    engine's thread has no Python frames), so most of the peak is activations.
    bcrafton (C++ stacks): the peak (event 1843) is in the optimizer's step, after the last
    backward allocation (1809): every activation is freed by then, so 0 is right."""
    store = tmp_path / "store"
    got = {}
    for name in ("magma27_cs336", "bcrafton_cs336"):
        assert ingest_paths([shared_traces / "memsnap" / name / "memory_snapshot.pickle"], store, name).ok
        [got[name]] = snapshot_section(open_store(store), name, None).snapshots
    magma, bcrafton = got["magma27_cs336"], got["bcrafton_cs336"]
    assert magma["peak_seq"] == 1402 and magma["activations_at_peak"]["bytes"] > 0.5 * magma["peak_allocated_bytes"]
    assert bcrafton["peak_seq"] == 1843 and bcrafton["activations_at_peak"]["bytes"] == 0
    assert bcrafton["live_at_peak"][0]["frame"].startswith("optimizer.py:")


def test_without_a_backward_frame_activations_are_absent_not_0(tmp_path: Path) -> None:
    snapshot = _snapshots.build("2.5")
    for entry in snapshot["device_traces"][0]:
        entry["frames"] = [f for f in entry["frames"] if not _backward(f)]
    [record] = _section(tmp_path, snapshot)
    assert activations(snapshot, record["peak_seq"]) is None
    assert record["activations_at_peak"] is None and "backward frame" in record["absent_reasons"]["activations_at_peak"]


def test_what_a_torch_2_0_snapshot_does_not_record_is_absent_with_its_reason(tmp_path: Path) -> None:
    from stepscope.analysis.absent import jsonable
    from stepscope.analysis.sections import SECTIONS

    snapshot = _snapshots.build("2.0", oom=True)
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    assert ingest_paths([path], tmp_path / "store", "r").ok
    result = snapshot_section(open_store(tmp_path / "store"), "r", None)
    [record] = jsonable(SECTIONS["snapshot"].to_json(result))["snapshots"]
    _check(record, replay(snapshot))
    assert record["peak_ts_ns"] is None and "2.1" in record["absent_reasons"]["peak_ts_ns"]
    assert record["oom"]["ts_ns"] is None and "ts_ns" in record["oom"]["absent_reasons"]
    assert all(b["ts_ns"] is None and b["absent_reasons"]["ts_ns"] for b in record["curve"])
