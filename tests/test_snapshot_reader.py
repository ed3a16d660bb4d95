"""The memory-snapshot reader's contract: on any malformed input, only ``TraceFormatError``.

``load_snapshot`` let AttributeError and MemoryError escape on malformed pickles, and
``snapshot_table`` raised TypeError on a dict without a list of segments. Nothing in a pickle may
run (the unpickler refuses every global). Needs no torch: the reader is plain Python.
"""

from __future__ import annotations

import pickle
import struct
from pathlib import Path
from typing import Any

import pytest

from stepscope.collector.memory_snapshot import load_snapshot, snapshot_table
from stepscope.errors import TraceFormatError

MALFORMED_PICKLES = {
    "APPENDS on a dict (AttributeError)": b"\x80\x04}(K\x01e.",
    "BUILD on an int (AttributeError)": b"\x80\x04K\x01}b.",
    "BINBYTES8 of 2**62 bytes (MemoryError)": b"\x80\x04\x8e" + struct.pack("<Q", 2**62) + b".",
    "SETITEM on an empty list (IndexError)": b"\x80\x04]K\x01K\x02s.",
    "undecodable SHORT_BINUNICODE": b"\x80\x04\x8c\x02\xff\xfe\x94.",
    "stack underflow": b"\x80\x04a.",
    "memo miss": b"\x80\x04h\x05.",
    "truncated": pickle.dumps({"segments": [{"address": 1}]})[:-5],
    "not a pickle": b"PK\x03\x04 a zip file",
    "empty": b"",
    "a list, not a snapshot": pickle.dumps([1, 2, 3]),
}


class _Trap:
    sprung = False

    def __reduce__(self) -> tuple[Any, ...]:
        return (_spring, ())


def _spring() -> None:
    _Trap.sprung = True


@pytest.mark.parametrize("case", list(MALFORMED_PICKLES))
def test_malformed_pickles_are_trace_format_errors(tmp_path: Path, case: str) -> None:
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(MALFORMED_PICKLES[case])
    with pytest.raises(TraceFormatError) as info:
        load_snapshot(path)
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)


def test_a_memo_index_that_would_exhaust_memory_is_refused_without_using_it(tmp_path: Path) -> None:
    """``LONG_BINPUT`` naming memo index 100 million: CPython's unpickler grows its memo to twice
    that and zero-fills it (1.6 GB for 9 bytes; 10.7 GB for the index the fuzz campaign drew).
    The unpickle runs with its address space bounded, so the file is refused in one line and
    the process's peak memory does not grow by the memo's size."""
    import resource

    path = tmp_path / "memo.pickle"
    path.write_bytes(b"\x80\x02]r" + struct.pack("<I", 100_000_000) + b".")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    limit = resource.getrlimit(resource.RLIMIT_AS)
    with pytest.raises(TraceFormatError, match="memo index in it exhausts memory"):
        load_snapshot(path)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before < 800_000_000
    assert resource.getrlimit(resource.RLIMIT_AS) == limit  # the bound is lifted after


def test_a_pickle_that_would_run_code_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    path = tmp_path / "hostile.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "payload": _Trap()}))
    with pytest.raises(TraceFormatError, match="refused global"):
        load_snapshot(path)
    assert not _Trap.sprung


def test_a_missing_or_special_file_is_a_trace_format_error(tmp_path: Path) -> None:
    import os

    with pytest.raises(TraceFormatError, match="cannot read"):
        load_snapshot(tmp_path / "missing.pickle")
    fifo = tmp_path / "fifo.pickle"
    os.mkfifo(fifo)
    with pytest.raises(TraceFormatError):
        load_snapshot(fifo)


GOOD_SEGMENT = {"device": 0, "address": 4096, "total_size": 2048, "requested_size": 2048, "stream": 0,
                "segment_type": "small", "blocks": [{"address": 4096, "size": 2048, "state": "inactive"}]}

MALFORMED_SNAPSHOTS: dict[str, Any] = {
    "a plain dict without segments": {"device_traces": []},
    "segments not a list": {"segments": 5},
    "segments None": {"segments": None},
    "a segment that is not a dict": {"segments": [7]},
    "blocks not a list": {"segments": [{**GOOD_SEGMENT, "blocks": 3}]},
    "a block that is a string": {"segments": [{**GOOD_SEGMENT, "blocks": ["x"]}]},
    "an address that is a string": {"segments": [{**GOOD_SEGMENT, "address": "0x10"}]},
    "an address beyond int64": {"segments": [{**GOOD_SEGMENT, "address": 2**70}]},
    "frames not a list of dicts": {"segments": [{**GOOD_SEGMENT, "frames": [1, 2]}]},
    "device_traces a dict": {"segments": [], "device_traces": {"0": []}},
    "a history entry that is a list": {"segments": [], "device_traces": [[[1, 2]]]},
    "a time that is not a number": {"segments": [], "device_traces": [[{"action": "alloc", "time_us": "soon"}]]},
    "a list, not a dict": [GOOD_SEGMENT],
}


@pytest.mark.parametrize("case", list(MALFORMED_SNAPSHOTS))
def test_malformed_snapshots_are_trace_format_errors(case: str) -> None:
    with pytest.raises(TraceFormatError) as info:
        snapshot_table(MALFORMED_SNAPSHOTS[case], "abc")
    assert str(info.value).startswith("memory snapshot: not a memory snapshot")


def test_a_well_formed_snapshot_still_converts() -> None:
    table = snapshot_table({"segments": [GOOD_SEGMENT],
                            "device_traces": [[{"action": "alloc", "time_us": 5, "addr": 4096, "size": 2048}]]},
                           "abc")
    assert table.column("record").to_pylist() == ["segment", "block", "trace"]
    assert table.column("ts_ns").to_pylist() == [None, None, 5000]
