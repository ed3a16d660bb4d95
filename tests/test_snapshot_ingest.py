"""``stepscope ingest x.pickle``: a memory snapshot stored as the four snapshot tables.

Every format torch has written since 2.0 (built in code, ``tests/_snapshots.py``) and the two
real snapshots of ../shared/traces/memsnap are ingested, and every table is compared with a plain
Python reading of the same pickle (``_snapshots.expected_*``). Bad input costs one line.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from stepscope.store.snapshot import reader
from stepscope.store.snapshot.unpickle import load_snapshot
from tests import _snapshots

REAL = ("magma27_cs336", "bcrafton_cs336")
VARIANTS = {
    "2.0": dict(version="2.0"),
    "2.1": dict(version="2.1"),
    "2.5 with allocator_settings": dict(version="2.5"),
    "expandable segments (segment_map/unmap)": dict(version="2.5", expandable=True),
    "oom": dict(version="2.5", oom=True),
    "frames with C++ frames": dict(version="2.5", cpp=True),
    "several devices": dict(version="2.1", devices=3),
}
SAMPLE_TRACE = Path(__file__).parent.parent / "sample_traces" / "cpu-transformer" / "rank0.pt.trace.json.gz"


def _stored(store: Path, table: str, columns: tuple[str, ...], order: str, run: str, rank: int) -> list[tuple]:
    """``table``'s rows of one rank as tuples of ``columns``, each with its stack's frames."""
    t = table[len("snapshot_"):][0]
    rows = open_store(store).sql(
        f"SELECT {', '.join(f'{t}.{c}' for c in columns)}, "
        "  (SELECT list((s.file, s.line, s.function) ORDER BY s.depth) FROM snapshot_stacks s "
        f"   WHERE s.run = {t}.run AND s.rank = {t}.rank AND s.source = {t}.source AND s.stack_id = {t}.stack_id) AS frames "
        f"FROM {table} {t} WHERE {t}.run = $run AND {t}.rank = $rank ORDER BY {order}",
        {"run": run, "rank": rank}).to_pylist()
    return [(*(r[c] for c in columns), _frame_tuple(r["frames"])) for r in rows]


def _stored_events(store: Path, run: str, rank: int = 0) -> list[tuple]:
    return _stored(store, "snapshot_events", ("device", "seq", "action", "address", "size", "stream", "ts_ns"),
                   "e.device, e.seq", run, rank)


def _frame_tuple(frames: list[dict] | None) -> tuple | None:
    return tuple(tuple(f.values()) for f in frames) if frames else None


def _stored_blocks(store: Path, run: str, rank: int = 0) -> list[tuple]:
    return _stored(store, "snapshot_blocks", ("device", "segment_address", "address", "size", "requested_size", "state"),
                   "b.device, b.address", run, rank)


def _stored_segments(store: Path, run: str, rank: int = 0) -> list[tuple]:
    rows = open_store(store).sql(
        "SELECT device, address, total_size, allocated_size, stream, segment_type, is_expandable "
        "FROM snapshot_segments WHERE run = $run AND rank = $rank ORDER BY device, address",
        {"run": run, "rank": rank}).to_pylist()
    return [tuple(r.values()) for r in rows]


def _check_against_plain_reading(path: Path, store: Path, run: str, rank: int = 0) -> None:
    snapshot = load_snapshot(path)
    assert _stored_events(store, run, rank) == _snapshots.expected_events(snapshot)
    assert _stored_blocks(store, run, rank) == sorted(_snapshots.expected_blocks(snapshot), key=lambda r: (r[0], r[2]))
    assert _stored_segments(store, run, rank) == sorted(_snapshots.expected_segments(snapshot), key=lambda r: (r[0], r[1]))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_format_is_stored_as_the_pickle_says(tmp_path: Path, variant: str) -> None:
    snapshot = _snapshots.build(**VARIANTS[variant])
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    report = ingest_paths([path], tmp_path / "store", "r")
    assert report.ok and [t.events for t in report.stored] == [len(_snapshots.expected_events(snapshot))]
    _check_against_plain_reading(path, tmp_path / "store", "r")
    stacks = open_store(tmp_path / "store").sql(
        "SELECT count(DISTINCT stack_id) AS n, count(*) AS frames FROM snapshot_stacks").to_pylist()[0]
    distinct = {f for f in (r[-1] for r in _snapshots.expected_events(snapshot) + _snapshots.expected_blocks(snapshot)) if f}
    assert stacks == {"n": len(distinct), "frames": sum(len(f) for f in distinct)}  # each stack once


@pytest.mark.parametrize("name", REAL)
def test_real_snapshots_are_stored_as_the_pickle_says(tmp_path: Path, shared_traces: Path, name: str) -> None:
    path = shared_traces / "memsnap" / name / "memory_snapshot.pickle"
    report = ingest_paths([path], tmp_path / "store", "real")
    assert report.ok
    _check_against_plain_reading(path, tmp_path / "store", "real")


def test_streamed_reading_takes_entries_early_and_gives_the_same_columns(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "big.pickle"
    path.write_bytes(pickle.dumps(_snapshots.build("2.5", devices=2, cpp=True, repeat=400)))
    monkeypatch.setattr(reader, "SCAN_BYTES", 4096)
    streamed = reader.read_snapshot(path)
    whole = reader.read_snapshot(path, stream=False)
    assert streamed.taken_early > len(streamed.history) // 2 and whole.taken_early == 0
    for column in ("action", "address", "size", "stream", "time_us", "stack"):
        assert streamed.history.column(column) == whole.history.column(column), column
    assert streamed.history.device_rows == whole.history.device_rows == [4002, 4002]
    assert streamed.stacks.frames == whole.stacks.frames


def test_entries_taken_early_that_the_lists_do_not_hold_in_order_are_read_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dict with an ``action`` outside the history (here inside a segment) is taken by the scan;
    the check after the load sees it is not a history entry and the file is read again."""
    snapshot = _snapshots.build("2.5", repeat=300)
    snapshot["segments"][0]["decoy"] = [{"action": "alloc", "addr": 1, "size": 2, "stream": 0}]
    path = tmp_path / "decoy.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    monkeypatch.setattr(reader, "SCAN_BYTES", 2048)
    got = reader.read_snapshot(path)
    assert got.taken_early == 0 and len(got.history) == len(_snapshots.expected_events(snapshot))


def test_rank_from_the_file_name_or_the_option_and_twice_is_skipped(tmp_path: Path) -> None:
    snap = pickle.dumps(_snapshots.build("2.1"))
    named = tmp_path / "rank-3.pickle"
    named.write_bytes(snap)
    store = tmp_path / "store"
    first = ingest_paths([named], store, "r")
    assert [(t.rank, t.rank_from, t.skipped) for t in first.stored] == [(3, "filename", False)]
    again = ingest_paths([named], store, "r")
    assert [t.skipped for t in again.stored] == [True]
    other = tmp_path / "snap.pickle"
    other.write_bytes(pickle.dumps(_snapshots.build("2.1", devices=2)))
    chosen = ingest_paths([other], store, "r", rank=5)
    assert [(t.rank, t.rank_from) for t in chosen.stored] == [(5, "option")]
    assert open_store(store).sql("SELECT rank, count(*) AS n FROM snapshot_events GROUP BY ALL ORDER BY rank"
                                 ).to_pylist() == [{"rank": 3, "n": 12}, {"rank": 5, "n": 2 * 12}]


def test_a_snapshot_beside_the_trace_of_its_rank_clashes_with_nothing(tmp_path: Path) -> None:
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(_snapshots.build("2.5")))
    report = ingest_paths([SAMPLE_TRACE, path], tmp_path / "store", "r", rank=0)
    assert report.ok and {t.run for t in report.stored} == {"r"} and not any(t.note for t in report.stored)
    sources = open_store(tmp_path / "store").sql(
        "SELECT rank, json_extract_string(metadata, '$.input') AS input FROM sources ORDER BY input NULLS FIRST").to_pylist()
    assert sources == [{"rank": 0, "input": None}, {"rank": 0, "input": "memory_snapshot"}]


def _hostile(opcodes: bytes) -> bytes:
    return b"\x80\x04" + opcodes


HOSTILE = {
    "GLOBAL": _hostile(b"cos\nsystem\n(S'true'\ntR."),
    "STACK_GLOBAL": _hostile(b"\x8c\x02os\x8c\x06system\x93\x8c\x04true\x85R."),
    "INST": _hostile(b"(S'true'\nios\nsystem\n."),
    "OBJ": _hostile(b"(cos\nsystem\nS'true'\no."),
    "PERSID": _hostile(b"Pid\n."),
    "BINPERSID": _hostile(b"K\x01Q."),
    "global inside a snapshot": pickle.dumps({"segments": [], "device_traces": [[{"action": pickle.PickleError}]]}),
}


def test_bad_files_cost_one_line_each_and_the_rest_is_stored(tmp_path: Path) -> None:
    good = tmp_path / "good.pickle"
    good.write_bytes(pickle.dumps(_snapshots.build("2.5", oom=True)))
    bad = {"not a snapshot": pickle.dumps([1, 2, 3]), "truncated": pickle.dumps(_snapshots.build("2.1"))[:-40],
           "not a pickle at all": b"\x80\x04 this is no pickle", **HOSTILE}
    paths = []
    for i, (name, data) in enumerate(bad.items()):
        paths.append(tmp_path / f"bad{i}.pickle")
        paths[-1].write_bytes(data)
    store = tmp_path / "store"
    result = subprocess.run([sys.executable, "-m", "stepscope.cli", "ingest", *map(str, paths), str(good),
                             str(SAMPLE_TRACE), "--store", str(store), "--run", "r", "--quiet"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert sorted(line.split(": ", 1)[0] for line in lines) == sorted(map(str, paths)), lines
    by_name = dict(zip(bad, (next(line for line in lines if line.startswith(f"{p}: ")) for p in paths)))
    assert "truncated" in by_name["truncated"] and "no list of 'segments'" in by_name["not a snapshot"]
    for name in HOSTILE:
        assert "refused" in by_name[name], by_name[name]
    stored = open_store(store).sql("SELECT count(*) AS n FROM sources").to_pylist()
    assert stored == [{"n": 2}]  # the good snapshot and the trace
    assert not (tmp_path / "true").exists()


def test_a_registered_extension_code_is_refused_too(tmp_path: Path) -> None:
    """``EXT1`` names a global through copyreg's registry: the unpickler refuses it as well."""
    import copyreg

    from stepscope.errors import TraceFormatError

    path = tmp_path / "ext.pickle"
    path.write_bytes(_hostile(b"\x82\xf0."))
    copyreg.add_extension("os", "system", 240)
    try:
        with pytest.raises(TraceFormatError, match="refused global os.system"):
            reader.read_snapshot(path)
    finally:
        copyreg.remove_extension("os", "system", 240)


def test_the_collector_reads_snapshots_with_the_stores_unpickler() -> None:
    """One place unpickles snapshots: the collector's names are the store's."""
    from stepscope.collector import memory_snapshot
    from stepscope.store.snapshot import unpickle

    assert memory_snapshot.SnapshotUnpickler is unpickle.SnapshotUnpickler
    assert memory_snapshot.load_snapshot is unpickle.load_snapshot


@pytest.mark.parametrize(("field", "value", "problem"), [
    ("addr", 1.5, "addr is not an integer"), ("size", "8", "size is not an integer"),
    ("time_us", 2**63, "time_us is out of range"), ("frames", {"a": 1}, "frames is not a list")])
def test_a_history_value_not_as_torch_writes_it_is_named(tmp_path: Path, field: str, value: Any, problem: str) -> None:
    """The reader takes entries in bulk (pyarrow would truncate a float to an int): a value of
    the wrong type or range still costs one line that names it, never a silently changed number."""
    from stepscope.errors import TraceFormatError

    snapshot = _snapshots.build("2.5", repeat=3)
    snapshot["device_traces"][0][-2][field] = value
    path = tmp_path / "odd.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    with pytest.raises(TraceFormatError, match=problem):
        reader.read_snapshot(path)


def test_bools_in_history_values_read_as_integers_in_either_path(tmp_path: Path) -> None:
    """``True`` is an int to Python's pickle but not to pyarrow: the entry-by-entry path takes it."""
    snapshot = _snapshots.build("2.5", repeat=3)
    snapshot["device_traces"][0][0]["stream"] = True
    path = tmp_path / "bool.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    assert reader.read_snapshot(path).history.column("stream")[0].as_py() == 1


def test_frame_lists_that_hold_themselves_cost_one_line(tmp_path: Path) -> None:
    """The bulk path compares neighbouring frame lists (``list == list``): on lists holding
    themselves that recurses without end; the file is still refused in one line."""
    from stepscope.errors import TraceFormatError

    snapshot = _snapshots.build("2.5", repeat=3)
    a: list[Any] = []
    a.append(a)
    b: list[Any] = []
    b.append(b)
    snapshot["device_traces"][0][3]["frames"], snapshot["device_traces"][0][4]["frames"] = [a], [b]
    path = tmp_path / "loop.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    with pytest.raises(TraceFormatError, match="a frame is not an object"):
        reader.read_snapshot(path)
