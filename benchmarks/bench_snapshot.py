"""Ingesting a large CUDA memory snapshot: peak RSS against the file's size, and wall time.

Target (issue 22): a 1 GB snapshot ingests (``stepscope ingest x.pickle``, whole process) with
peak RSS at most 3x the file's size, within a minute on this machine: judged on the process's
CPU time (the machine is shared; wall time, printed too, grows with its load). The snapshot is built by
repeating a real one's history (../shared/traces/memsnap, ``--real``) until the file reaches
``--mb`` MB, laid out as torch writes it: each frame dict and string written once and referred
to after (the pickle memo), history entries in batches of 1000, 64 KiB frames. Repeats from
the second on are byte-identical, so the file is written by copying them (seconds, little memory).

For reference, the same snapshot unpickled whole (a plain ``SnapshotUnpickler.load()``, what
ingest did before it streamed) is measured too when ``--plain`` is given (needs ~5x the file's
size in memory).

    python benchmarks/bench_snapshot.py [--mb 1024] [--real bcrafton_cs336] [--plain]
"""

from __future__ import annotations

import argparse
import io
import os
import pickle
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any

from _measure import MeasureError, REPO_ROOT, run_process, shared_traces_dir, verdict

TARGET_RSS_VS_FILE = 3.0
TARGET_WALL_S = 60.0
FRAME_BYTES = 64 * 1024
BATCH = 1000


class _Emitter(pickle._Pickler):  # type: ignore[name-defined] # the pure-Python pickler: its memo is open
    """Pickles unframed, memoizing (keeping for later references) only what a snapshot shares:
    strings and frame dicts. History entries and lists are written with ``MEMOIZE`` (so the
    memo counts agree with an unpickler's) but not kept, since nothing refers to them again."""

    def __init__(self, out: io.BytesIO) -> None:
        super().__init__(out, protocol=4)
        self.count = 0
        self.framer.start_framing = lambda: None  # type: ignore[method-assign] # we frame

    def memoize(self, obj: Any) -> None:
        self.write(pickle.MEMOIZE)
        if not (type(obj) is list or (type(obj) is dict and "action" in obj)):
            self.memo[id(obj)] = self.count, obj
        self.count += 1


class _Framed:
    """Writes pickle bytes to a file in 64 KiB ``FRAME``s, cut between objects."""

    def __init__(self, handle: Any) -> None:
        self.handle, self.pending = handle, bytearray()

    def add(self, data: bytes) -> None:
        self.pending += data
        if len(self.pending) >= FRAME_BYTES:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.handle.write(pickle.FRAME + struct.pack("<Q", len(self.pending)) + self.pending)
            self.pending = bytearray()


def build(real: dict[str, Any], path: Path, target_bytes: int) -> int:
    """Write a snapshot of ``real``'s segments and its device 0 history repeated to ~``target_bytes``."""
    entries = real["device_traces"][0]
    out = io.BytesIO()
    emitter = _Emitter(out)

    def take() -> bytes:
        data = out.getvalue()
        out.seek(0)
        out.truncate()
        return data

    def save(obj: Any) -> bytes:
        emitter.save(obj)
        return take()

    with path.open("wb") as handle:
        handle.write(pickle.PROTO + b"\x04")
        framed = _Framed(handle)
        emitter.memoize({})  # the top-level dict (memo 0)
        framed.add(pickle.EMPTY_DICT + take() + pickle.MARK + save("segments") + save(real["segments"])
                   + save("device_traces"))
        emitter.memoize([])
        framed.add(pickle.EMPTY_LIST + take())  # device_traces
        emitter.memoize([])
        framed.add(pickle.EMPTY_LIST + take())  # device 0's history
        written, repeats, batch = 0, 0, 0
        unit: list[bytes] | None = None
        per_pass = 0  # MEMOIZE opcodes in one copied pass: the unpickler's memo grows by these
        while repeats < 2 or handle.tell() < target_bytes:
            if repeats == 1:  # from the second pass on every shared object is a memo reference
                before = emitter.count
                unit = [save(e) for e in entries]
                per_pass = emitter.count - before
            elif repeats > 1:
                emitter.count += per_pass
            for index, entry in enumerate(entries):
                if batch == 0:
                    framed.add(pickle.MARK)
                framed.add(unit[index] if unit is not None else save(entry))
                batch += 1
                written += 1
                if batch == BATCH:
                    framed.add(pickle.APPENDS)
                    batch = 0
            repeats += 1
        if batch:
            framed.add(pickle.APPENDS)
        framed.add(pickle.APPEND)  # the history into device_traces
        rest = [(k, v) for k, v in real.items() if k not in ("segments", "device_traces")]
        framed.add(b"".join(save(k) + save(v) for k, v in rest) + pickle.SETITEMS + pickle.STOP)
        framed.flush()
    return written


def _load_real(name: str) -> dict[str, Any]:
    shared = shared_traces_dir()
    if shared is None:
        sys.exit("../shared/traces is not present: this benchmark repeats a real snapshot's history")
    sys.path.insert(0, str(REPO_ROOT))
    from stepscope.store.snapshot.unpickle import load_snapshot

    return load_snapshot(shared / "memsnap" / name / "memory_snapshot.pickle")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=1024, help="size of the built snapshot in MB (default 1024)")
    parser.add_argument("--real", default="bcrafton_cs336", help="the real snapshot to repeat (memsnap/<name>)")
    parser.add_argument("--plain", action="store_true", help="also measure a plain whole load, for reference")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-snapshot-") as tmp:
        path = Path(tmp) / "rank-0.pickle"
        real = _load_real(args.real)
        entries = build(real, path, args.mb * 1_000_000)
        del real
        size = path.stat().st_size
        print(f"built {path.name}: {size / 1e6:,.0f} MB, {entries:,} history entries (memsnap/{args.real} repeated)")
        env = {"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"}
        try:
            m = run_process([sys.executable, "-m", "stepscope.cli", "ingest", str(path), "--store",
                             str(Path(tmp) / "store"), "--run", "bench", "--quiet"], label="stepscope ingest",
                            env=env, cwd=REPO_ROOT, timeout_s=1800)
        except MeasureError as exc:
            sys.exit(str(exc))
        print(f"stepscope ingest (whole process): {m.wall_s:.1f} s wall, {m.cpu_s:.1f} s CPU, "
              f"peak RSS {m.peak_rss_mb:,.0f} MB")
        print(verdict("peak RSS / file size", m.peak_rss_bytes / size, TARGET_RSS_VS_FILE, at_least=False))
        # CPU time is the trusted figure on a shared machine (wall time grows with the load); both shown
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print(verdict("CPU time / 60 s", m.cpu_s / TARGET_WALL_S, 1.0, at_least=False))
        print(verdict("wall time / 60 s", m.wall_s / TARGET_WALL_S, 1.0, at_least=False))
        if args.plain:
            snippet = ("from stepscope.store.snapshot.unpickle import load_snapshot; "
                       f"load_snapshot({str(path)!r})")
            p = run_process([sys.executable, "-c", snippet], label="plain load", env=env, cwd=REPO_ROOT,
                            timeout_s=1800)
            print(f"plain whole load (reference): {p.wall_s:.1f} s, peak RSS {p.peak_rss_mb:,.0f} MB "
                  f"({p.peak_rss_bytes / size:.2f}x the file)")


if __name__ == "__main__":
    main()
