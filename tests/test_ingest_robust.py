"""Hostile and unusual input: every failure is one line, nothing stored is lost, nothing hangs.

Each case here crashed, hung, stored garbage or doubled a rank before (an adversarial probe found
them); the inputs are built by the tests. The rules are checked through the ingest API, the CLI
and the stored rows, not through the reader's internals.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stepscope.cli import main
from stepscope.errors import TraceFormatError
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths, ingest_trace_file
from tests.test_ingest_input import GOOD_EVENTS

REPO = Path(__file__).resolve().parents[1]


def _rows(store: Path, query: str) -> list[dict[str, Any]]:
    return open_store(store).sql(query).to_pylist()


def _count(store: Path, table: str = "events") -> int:
    return _rows(store, f"SELECT count(*) AS n FROM {table}")[0]["n"]


def _doc(events: list[dict[str, Any]], **top: Any) -> dict[str, Any]:
    return {"schemaVersion": 1, **top, "traceEvents": events}


def _write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode() if isinstance(text, str) else text
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def _cli(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``stepscope`` in its own process, so a hang is a timeout and a crash a traceback."""
    return subprocess.run([sys.executable, "-m", "stepscope.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, check=False)


def _event(**fields: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 10, "dur": 5, **fields}


# --- item 3: inputs that crashed the whole batch -------------------------------------------------

DEEP = "[" * 10_000 + "]" * 10_000


def test_inputs_that_crashed_the_batch_are_one_line_each(tmp_path: Path) -> None:
    folder = tmp_path / "batch"
    refused = {
        "deep-args.json": '{"traceEvents": [{"ph": "X", "name": "op", "ts": 1, "dur": 1, "args": {"x": %s}}]}' % DEEP,
        "deep-key.json": '{"foo": %s, "traceEvents": []}' % DEEP,
        "base-1e20.json": '{"baseTimeNanoseconds": 100000000000000000000, "traceEvents": [%s]}'
                          % json.dumps(_event()),
    }
    for name, text in refused.items():
        _write(folder / name, text)
    _write(folder / "device-name-number.json",
           json.dumps(_doc([_event()], deviceProperties=[{"id": 0, "name": 123, "totalGlobalMem": 2**70}])))
    _write(folder / "good.json", json.dumps(_doc(GOOD_EVENTS)))
    store = tmp_path / "store"
    done = _cli(["ingest", str(folder), "--store", str(store), "--run", "r"])
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 4, lines
    problems = {Path(line.split(": ", 1)[0]).name: line for line in lines}
    assert set(problems) == {*refused, "device-name-number.json"}
    assert "nested too deeply" in problems["deep-args.json"] and "nested too deeply" in problems["deep-key.json"]
    assert "baseTimeNanoseconds" in problems["base-1e20.json"] and "out of range" in problems["base-1e20.json"]
    assert "totalGlobalMem" in problems["device-name-number.json"] and "out of range" in problems["device-name-number.json"]
    assert _rows(store, "SELECT path FROM sources") == [{"path": str(folder / "good.json")}]


def test_a_numeric_device_name_is_not_a_name(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.json", json.dumps(_doc([_event()], deviceProperties=[{"id": 0, "name": 123}])))
    ingest_trace_file(path, tmp_path / "store", "r")
    [row] = _rows(tmp_path / "store", "SELECT gpu_name, device_properties FROM sources")
    assert row["gpu_name"] is None and json.loads(row["device_properties"]) == [{"id": 0, "name": 123}]


def test_an_unexpected_exception_costs_one_file_not_the_batch(tmp_path: Path, make_trace, monkeypatch,
                                                              capsys) -> None:
    import stepscope.store.ingest as ingest_module

    real_convert = ingest_module.convert

    def buggy(trace, *args, **kwargs):
        if trace.path.endswith("rank0.json"):
            raise ZeroDivisionError("a bug\nover two lines")
        return real_convert(trace, *args, **kwargs)

    monkeypatch.setattr(ingest_module, "convert", buggy)
    bad = make_trace("rank0.json", GOOD_EVENTS)
    make_trace("rank1.json", GOOD_EVENTS)
    assert main(["ingest", str(bad.parent), "--store", str(tmp_path / "s"), "--run", "r"]) == 3
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == f"{bad}: internal error (ZeroDivisionError: a bug over two lines)"
    assert _rows(tmp_path / "s", "SELECT rank FROM sources") == [{"rank": 1}]


# --- item 4: numbers outside the store's range ---------------------------------------------------

@pytest.mark.parametrize(
    ("case", "event", "column"),
    [
        ("ts 1.2e29", _event(ts=1.2e29), "ts"),
        ("ts 1e300", _event(ts=1e300, dur=1e300), "ts"),
        ("dur 1e300", _event(dur=1e300), "dur"),
        ("ts 9e18 us (wrapped round in int64 ns)", _event(ts=9_000_000_000_000_000_000), "ts"),
        ("ts beyond float64", _event(ts=10**400), "ts"),
        ("exact fractional epoch ts", _event(ts=9_300_000_000_000_000.5), "ts"),
        ("ts + dur beyond int64", _event(ts=9_000_000_000_000_000, dur=900_000_000_000_000), "dur"),
    ],
)
def test_out_of_range_times_are_refused_not_stored_as_zero(tmp_path: Path, case: str, event: dict,
                                                           column: str) -> None:
    path = _write(tmp_path / "t.json", json.dumps(_doc([_event(), event])))
    with pytest.raises(TraceFormatError) as info:
        ingest_trace_file(path, tmp_path / "store", "r")
    message = str(info.value)
    assert message.startswith(f"{path}: event 1 ('op'): '{column}' ") and "out of range" in message, message
    assert not (tmp_path / "store" / "sources").exists()


def test_out_of_range_base_time_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.json", json.dumps(_doc([_event()], baseTimeNanoseconds=2**63)))
    with pytest.raises(TraceFormatError, match="baseTimeNanoseconds .* out of range"):
        ingest_trace_file(path, tmp_path / "store", "r")
    edge = _write(tmp_path / "edge.json", json.dumps(_doc([_event(ts=0, dur=0)], baseTimeNanoseconds=2**63 - 1)))
    with pytest.raises(TraceFormatError, match="out of range"):  # base plus the event's ts overflows
        ingest_trace_file(edge, tmp_path / "store", "r")


def test_a_collective_size_beyond_int64_is_refused_not_wrapped(tmp_path: Path) -> None:
    # 2**32 x 2**32 elements: an int64 product wraps round to 0.
    huge = _event(name="c10d::allreduce_", args={"Input Dims": [[[2**32, 2**32]]], "Input type": ["float"]})
    path = _write(tmp_path / "t.json", json.dumps(_doc([huge])))
    with pytest.raises(TraceFormatError, match="out of range"):
        ingest_trace_file(path, tmp_path / "store", "r")


# --- item 5: one trace, two files --------------------------------------------------------------

def _gpu_trace(shift_us: int = 0) -> dict[str, Any]:
    events = [dict(e, ts=e["ts"] + shift_us) for e in GOOD_EVENTS]
    return _doc(events, distributedInfo={"rank": 0, "world_size": 1})


def test_the_same_trace_in_another_file_is_stored_once(tmp_path: Path) -> None:
    doc = _gpu_trace()
    folder = tmp_path / "traces"
    _write(folder / "a.json", json.dumps(doc))
    _write(folder / "b.json.gz", json.dumps(doc))
    _write(folder / "c.json", json.dumps(doc, indent=3))  # only whitespace changed
    store = tmp_path / "store"
    done = _cli(["ingest", str(folder), "--store", str(store), "--run", "r"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(f"same trace as {folder / 'a.json'}") == 2, done.stdout
    assert _count(store, "sources") == 1 and _count(store) == len(GOOD_EVENTS)
    summary = _cli(["summary", "--run", "r", "--store", str(store), "--format", "json"])
    assert summary.returncode == 0, summary.stderr
    # Another run is another run: the copy is stored there.
    assert not ingest_trace_file(folder / "b.json.gz", store, "other").skipped


def test_the_content_index_counts_only_while_its_trace_is_stored(tmp_path: Path) -> None:
    doc = json.dumps(_gpu_trace())
    store = tmp_path / "store"
    first = ingest_trace_file(_write(tmp_path / "a.json", doc), store, "r")
    for part in store.glob(f"*/run=r/rank=0/part-{first.source}.parquet"):
        part.unlink()  # the rank removed by hand: its content index entry is left behind
    assert not ingest_trace_file(_write(tmp_path / "b.json.gz", doc), store, "r").skipped
    assert _count(store, "sources") == 1 and _count(store) == len(GOOD_EVENTS)


def test_a_whitespace_change_inside_a_string_is_another_trace(tmp_path: Path) -> None:
    doc = _gpu_trace()
    other = json.loads(json.dumps(doc))
    other["traceEvents"][2]["name"] = "ge mm"
    store = tmp_path / "store"
    ingest_trace_file(_write(tmp_path / "a.json", json.dumps(doc)), store, "r", rank=0)
    assert not ingest_trace_file(_write(tmp_path / "b.json", json.dumps(other)), store, "r", rank=1).skipped


def test_two_recordings_of_one_rank_that_overlap_are_refused_naming_both(tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = _write(tmp_path / "first.json", json.dumps(_gpu_trace()))
    second_doc = _gpu_trace(shift_us=50)  # overlaps the first in time
    second_doc["traceEvents"].append(_event(ts=1_120, dur=1))
    second = _write(tmp_path / "second.json", json.dumps(second_doc))
    ingest_trace_file(first, store, "r")
    before = sorted(p.read_bytes() for p in store.rglob("*.parquet"))
    with pytest.raises(TraceFormatError) as info:
        ingest_trace_file(second, store, "r")
    message = str(info.value)
    assert message.startswith(f"{second}: ") and str(first) in message and "rank 0" in message
    assert sorted(p.read_bytes() for p in store.rglob("*.parquet")) == before
    assert _cli(["summary", "--run", "r", "--store", str(store)]).returncode == 0


def test_disjoint_traces_of_one_rank_are_kept(tmp_path: Path) -> None:
    """The collector stores one trace per profiling cycle of a rank in one run."""
    store = tmp_path / "store"
    for cycle in range(2):
        path = _write(tmp_path / f"cycle{cycle}.json", json.dumps(_gpu_trace(shift_us=cycle * 10_000)))
        assert not ingest_trace_file(path, store, "r").skipped
    assert _count(store, "sources") == 2 and _count(store) == 2 * len(GOOD_EVENTS)
    assert _cli(["summary", "--run", "r", "--store", str(store)]).returncode == 0


# --- item 2: two ingests of one trace at the same time -------------------------------------------

def _big_trace(steps: int = 400) -> dict[str, Any]:
    """A trace big enough (~10k events) for two ingests of it to overlap."""
    events = []
    for step in range(steps):
        base = 1_000 + step * 100
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1,
                       "tid": 1, "ts": base, "dur": 90})
        for k in range(12):
            events.append(_event(name=f"aten::op{k}", ts=base + k * 7, dur=5,
                                 args={"External id": step * 100 + k, "Input Dims": [[4, 4]]}))
    return _doc(events)


@pytest.mark.parametrize("copies", ["same file", "same content, two files"])
def test_concurrent_ingests_of_one_trace_store_it_once(tmp_path: Path, copies: str) -> None:
    text = json.dumps(_big_trace())
    first = _write(tmp_path / "rank0.json", text)
    second = first if copies == "same file" else _write(tmp_path / "rank0.json.gz", text)
    for attempt in range(3):
        store = tmp_path / f"store{attempt}"
        jobs = [subprocess.Popen([sys.executable, "-m", "stepscope.cli", "ingest", str(path), "--store",
                                  str(store), "--run", "r"], cwd=REPO, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for path in (first, second)]
        outcomes = [(job.wait(timeout=120), job.stderr.read()) for job in jobs]
        for job in jobs:
            job.stdout.close()
            job.stderr.close()
        assert [code for code, _ in outcomes] == [0, 0], outcomes
        assert _count(store, "sources") == 1
        assert _count(store) == len(_big_trace()["traceEvents"])
        assert not list(store.rglob("*.tmp"))


# --- item 6: only regular files are read ---------------------------------------------------------

def test_fifos_devices_sockets_loops_and_missing_paths_get_one_line_each(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    good = _write(folder / "good.json", json.dumps(_doc(GOOD_EVENTS)))
    os.mkfifo(folder / "fifo.json")
    os.symlink(folder / "nowhere.json", folder / "broken.json.gz")
    os.symlink(folder / "loop.json", folder / "loop.json")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(folder / "sock.json"))
        named_fifo = tmp_path / "named.json"
        os.mkfifo(named_fifo)
        missing = tmp_path / "missing.json"
        store = tmp_path / "store"
        done = _cli(["ingest", str(named_fifo), str(missing), "/dev/null", str(folder),
                     "--store", str(store), "--run", "r"], timeout=60)
    finally:
        sock.close()
    assert done.returncode == 3, done.stderr
    lines = sorted(done.stderr.strip().splitlines())
    assert lines == sorted([
        f"{named_fifo}: not a regular file (a FIFO (named pipe))",
        f"{missing}: no such file or folder",
        "/dev/null: not a regular file (a character device)",
        f"{folder / 'fifo.json'}: not a regular file (a FIFO (named pipe))",
        f"{folder / 'broken.json.gz'}: broken symbolic link (points to {folder / 'nowhere.json'}, which does not exist)",
        f"{folder / 'loop.json'}: symbolic link loop",
        f"{folder / 'sock.json'}: not a regular file (a socket)",
    ])
    assert _rows(store, "SELECT path FROM sources") == [{"path": str(good)}]


@pytest.mark.timeout(30)  # a blocking open of the FIFO would wait for a writer forever
def test_a_path_swapped_for_a_fifo_after_selection_does_not_hang(tmp_path: Path) -> None:
    from stepscope.store.textstream import TextStream

    fifo = tmp_path / "t.json"
    os.mkfifo(fifo)
    with pytest.raises(TraceFormatError, match="not a regular file"):
        list(TextStream(fifo).blocks())


def test_only_missing_paths_is_exit_3_not_a_usage_error(tmp_path: Path) -> None:
    report = ingest_paths([tmp_path / "a.json", tmp_path / "b"], tmp_path / "store", "r")
    assert report.errors == [f"{tmp_path / 'a.json'}: no such file or folder",
                             f"{tmp_path / 'b'}: no such file or folder"]
    assert main(["ingest", str(tmp_path / "a.json"), "--store", str(tmp_path / "store")]) == 3


# --- item 8: the store cannot be written ----------------------------------------------------------

def _failing_write(code: int):
    def write(*_args: Any, **_kwargs: Any) -> None:
        raise OSError(code, os.strerror(code), "/store/events/run=r/rank=0/part-x.parquet.123.abc.tmp")

    return write


@pytest.mark.parametrize(("code", "problem"), [(errno.ENOSPC, "disk full"), (errno.EROFS, "store not writable"),
                                               (errno.EACCES, "store not writable")])
def test_write_errors_are_one_line_and_exit_3(tmp_path: Path, make_trace, monkeypatch, capsys,
                                              code: int, problem: str) -> None:
    store = tmp_path / "store"
    make_trace("rank0.json", GOOD_EVENTS)
    assert main(["ingest", str(tmp_path / "traces"), "--store", str(store), "--run", "kept"]) == 0
    before = sorted(p.read_bytes() for p in store.rglob("*.parquet"))
    capsys.readouterr()
    monkeypatch.setattr("stepscope.store.ingest.write_partition", _failing_write(code))
    assert main(["ingest", str(tmp_path / "traces"), "--store", str(store), "--run", "new"]) == 3
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"{tmp_path / 'traces' / 'rank0.json'}: not stored: {problem} in {store} (")
    assert ".tmp" not in line
    assert sorted(p.read_bytes() for p in store.rglob("*.parquet")) == before


def test_a_store_below_a_file_is_one_line(tmp_path: Path, make_trace) -> None:
    make_trace("rank0.json", GOOD_EVENTS)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    done = _cli(["ingest", str(tmp_path / "traces"), "--store", str(blocker / "store")])
    assert done.returncode == 3 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"{tmp_path / 'traces' / 'rank0.json'}: not stored: store not writable in {blocker / 'store'} "
        "(NotADirectoryError: Not a directory)"]


@pytest.mark.parametrize("fail_at", ["a rank table", "putting the parts in place"])
def test_a_write_error_after_some_parts_leaves_no_file_behind(tmp_path: Path, make_trace, monkeypatch,
                                                               fail_at: str) -> None:
    """The parts of a trace are written under temporary names and put in place together
    (``atomic.AtomicBatch``): a failure half way, or while they are flushed and renamed, leaves no
    part and no temporary file of the refused trace, and the store as it was."""
    from stepscope.store import atomic, ingest

    store = tmp_path / "store"
    make_trace("rank0.json", GOOD_EVENTS)
    assert main(["ingest", str(tmp_path / "traces"), "--store", str(store), "--run", "kept"]) == 0
    before = sorted(str(p.relative_to(store)) for p in store.rglob("*") if p.is_file())
    written: list[str] = []
    if fail_at == "a rank table":
        real = ingest.write_partition

        def write(root: Any, table: str, *args: Any, **kwargs: Any) -> Any:
            if len(written) == 5:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            written.append(table)
            return real(root, table, *args, **kwargs)

        monkeypatch.setattr("stepscope.store.ingest.write_partition", write)
    else:
        real_fsync = atomic._fsync

        def fsync(path: Path) -> None:
            written.append(str(path))
            if len(written) == 5:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            real_fsync(path)

        monkeypatch.setattr(atomic, "_fsync", fsync)
    report = ingest_paths([tmp_path / "traces" / "rank0.json"], store, "new")
    assert len(report.errors) == 1 and len(written) >= 5
    assert sorted(str(p.relative_to(store)) for p in store.rglob("*") if p.is_file()) == before
