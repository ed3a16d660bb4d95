"""kineto.read_bytes: the gzip and empty-text checks, against Python's gzip module as reference."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import pytest

from stepscope.errors import TraceFormatError
from stepscope.store.kineto import read_bytes

DOC = b'{"traceEvents": [{"ph": "X", "name": "k", "ts": 1, "dur": 2}]}'


def test_single_member_matches_gzip_module(tmp_path: Path) -> None:
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(DOC))
    text, _, size = read_bytes(path)
    assert text == gzip.decompress(path.read_bytes()) == DOC
    assert size == path.stat().st_size


def test_concatenated_members_are_all_read(tmp_path: Path) -> None:
    # `cat a.gz b.gz > c.gz` is a valid gzip file; gzip.decompress reads every member.
    halves = DOC[:20], DOC[20:]
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(halves[0]) + gzip.compress(halves[1]))
    assert read_bytes(path)[0] == gzip.decompress(path.read_bytes()) == DOC


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
        read_bytes(path)
    assert str(info.value).startswith(f"{path}: {problem}")


@pytest.mark.parametrize("text", [b"   \n\t ", gzip.compress(b" \n", mtime=0)], ids=["plain", "gzip"])
def test_whitespace_only_is_an_empty_trace(tmp_path: Path, text: bytes) -> None:
    path = tmp_path / ("t.json.gz" if text[:2] == b"\x1f\x8b" else "t.json")
    path.write_bytes(text)
    with pytest.raises(TraceFormatError, match="empty trace"):
        read_bytes(path)
