"""Reading a trace file as a stream: gzip members, broken streams and empty text, against Python's
gzip module as reference; pieces of events cut only between whole events."""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import zlib
from pathlib import Path

import msgspec
import pytest

from stepscope.errors import TraceFormatError
from stepscope.store import split, textstream
from stepscope.store.kineto import read_trace
from stepscope.store.textstream import TextStream

DOC = b'{"traceEvents": [{"ph": "X", "name": "k", "ts": 1, "dur": 2}]}'


def _text(path: Path) -> tuple[bytes, TextStream]:
    stream = TextStream(path)
    return b"".join(stream.blocks()), stream


def test_single_member_matches_gzip_module(tmp_path: Path) -> None:
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(DOC))
    text, stream = _text(path)
    assert text == gzip.decompress(path.read_bytes()) == DOC
    assert stream.file_bytes == path.stat().st_size
    assert stream.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_concatenated_members_are_all_read(tmp_path: Path) -> None:
    # `cat a.gz b.gz > c.gz` is a valid gzip file; gzip.decompress reads every member.
    halves = DOC[:20], DOC[20:]
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(halves[0]) + gzip.compress(halves[1]))
    assert _text(path)[0] == gzip.decompress(path.read_bytes()) == DOC


def test_a_big_stream_comes_in_bounded_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(textstream, "READ_BYTES", 1000)
    monkeypatch.setattr(textstream, "TEXT_BYTES", 4096)
    data = bytes(random.Random(1).choices(b"abcdef {}[],:0123456789", k=200_000))
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(data[:70_000]) + gzip.compress(data[70_000:]))
    stream = TextStream(path)
    blocks = list(stream.blocks())
    assert b"".join(blocks) == data and max(map(len, blocks)) <= 4096
    assert stream.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("name", "mangle", "problem"),
    [
        ("cut.json.gz", lambda z: z[: len(z) // 2], "truncated gzip"),
        ("cut-second.json.gz", lambda z: z + z[:10], "truncated gzip"),
        ("garbage-after.json.gz", lambda z: z + b"garbage!", "corrupt gzip"),
        ("bad-crc.json.gz", lambda z: z[:-8] + bytes([z[-8] ^ 0xFF]) + z[-7:], "corrupt gzip"),
    ],
)
def test_broken_gzip_is_one_clear_line(tmp_path: Path, name: str, mangle, problem: str) -> None:
    path = tmp_path / name
    path.write_bytes(mangle(gzip.compress(DOC)))
    with pytest.raises((EOFError, OSError, zlib.error)):
        gzip.decompress(path.read_bytes())  # the reference refuses it too
    with pytest.raises(TraceFormatError) as info:
        _text(path)
    assert str(info.value).startswith(f"{path}: {problem}")


@pytest.mark.parametrize("text", [b"   \n\t ", gzip.compress(b" \n", mtime=0)], ids=["plain", "gzip"])
def test_whitespace_only_is_an_empty_trace(tmp_path: Path, text: bytes) -> None:
    path = tmp_path / ("t.json.gz" if text[:2] == b"\x1f\x8b" else "t.json")
    path.write_bytes(text)
    with pytest.raises(TraceFormatError, match="empty trace"):
        read_trace(path, tmp_path)


def _awkward_events(count: int) -> list[dict]:
    """Events whose text holds what a cut could be fooled by: ``}, {`` inside strings and inside
    nested lists of objects, escaped quotes, brackets in names, deep-ish args."""
    events = []
    for i in range(count):
        events.append({"ph": "X", "cat": "cpu_op", "name": f'op}}, {{"x": [{i}]}} \\"q\\" ]', "ts": i, "dur": 1,
                       "args": {"list": [{"a": i}, {"b": [1, {"c": "}, {"}]}], "s": "], \"traceEvents\": ["}})
    return events


@pytest.mark.parametrize("indent", [None, 1])
def test_pieces_hold_every_event_once_and_the_content_hash_is_the_whole_texts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, indent: int | None) -> None:
    monkeypatch.setattr(split, "PIECE_BYTES", 700)
    monkeypatch.setattr(textstream, "READ_BYTES", 500)
    events = _awkward_events(60)
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0}], "traceEvents": events,
           "traceName": "a ] b", "list": [[1], {"x": "]"}], "baseTimeNanoseconds": 7}
    text = json.dumps(doc, indent=indent).encode()
    path = tmp_path / "t.json"
    path.write_bytes(text)
    (tmp_path / "work").mkdir()
    trace = read_trace(path, tmp_path / "work")
    assert len(trace.pieces) > 5
    pieces = [msgspec.json.decode(p.read_bytes()) for p in trace.pieces]
    assert [e for piece in pieces for e in piece] == events
    assert trace.content_sha256 == hashlib.sha256(msgspec.json.format(text, indent=-1)).hexdigest()
    assert trace.base_time_ns == 7 and trace.metadata == {"traceName": "a ] b", "list": [[1], {"x": "]"}]}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (b'{"traceEvents": [{"ph": "X"}, {"ph": "X",}]}', "not valid JSON"),
        (b'{"traceEvents": [{"ph": "X"}, {"ph": "X"}', "not valid JSON"),
        (b'{"traceEvents": [{"ph": "X"}], "x": }', "not valid JSON"),
        (b'{"a": {"traceEvents": []}}', "no traceEvents list"),
        (b'{"a": "traceEvents", "b": []}', "no traceEvents list"),
        (b'{"traceEvents": null}', "no traceEvents list"),
    ],
)
def test_malformed_text_around_the_events_is_refused(tmp_path: Path, text: bytes, problem: str) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(text)
    with pytest.raises(TraceFormatError, match=problem):
        read_trace(path, tmp_path)
