"""One atomic-write helper (stepscope/store/atomic.py): unique temporary names per writer,
fsync, rename; a failure leaves the old file and no temporary; nothing else in the package
replaces files by hand."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

from stepscope.store.atomic import TMP_SUFFIX, atomic_write, temporary_path, write_text_atomic

PACKAGE = Path(__file__).resolve().parents[1] / "stepscope"


def test_concurrent_writers_each_rename_a_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "doc.bin"
    payloads = [bytes([i]) * 200_000 for i in range(8)]
    barrier = threading.Barrier(len(payloads))

    def write(data: bytes) -> None:
        with atomic_write(target) as handle:
            barrier.wait()  # every writer holds its temporary file at once
            for start in range(0, len(data), 4096):
                handle.write(data[start:start + 4096])

    threads = [threading.Thread(target=write, args=(p,)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert target.read_bytes() in payloads  # one writer's bytes, whole; never a mix
    assert not list(target.parent.glob(f"*{TMP_SUFFIX}"))


def test_a_failed_write_keeps_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "doc.txt"
    write_text_atomic(target, "old")
    with pytest.raises(RuntimeError), atomic_write(target) as handle:
        handle.write(b"half of the new")
        raise RuntimeError("disk full")
    assert target.read_bytes() == b"old" and not list(tmp_path.glob(f"*{TMP_SUFFIX}"))
    a, b = temporary_path(target), temporary_path(target)
    assert a != b and a.name.startswith("doc.txt.") and a.name.endswith(TMP_SUFFIX)


def test_no_module_replaces_files_by_hand() -> None:
    """os.replace / fsync appear in atomic.py only (directory renames of whole runs aside)."""
    offenders = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if p.name != "atomic.py" and re.search(r"\bos\.(replace|fsync)\(", p.read_text())]
    assert offenders == []
