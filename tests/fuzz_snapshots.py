"""Mutated memory snapshots (``torch.cuda.memory._snapshot()`` pickles) for the snapshot reader.

The reader (``stepscope.collector.memory_snapshot``: ``load_snapshot`` then ``snapshot_table``)
must return a table or raise one ``TraceFormatError`` naming the file, whatever the pickle holds,
and run nothing from it. A case is a program, as for traces (``tests/fuzz_mutations.py``): the
real snapshot it starts from (../shared/traces/memsnap), edits of its plain data (a list
shortened or emptied, a field set to any value of the pool, a key removed, deep nesting) and
byte-level edits of the pickle (a bit flipped, truncation, bytes inserted or deleted).
"""

from __future__ import annotations

import copy
import pickle
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from tests.fuzz_mutations import SHARED_TRACES, VALUES, _edit

SNAPSHOT_SEEDS = ("memsnap/magma27_cs336/memory_snapshot.pickle", "memsnap/bcrafton_cs336/memory_snapshot.pickle")
KEYS = ("segments", "device_traces", "address", "total_size", "requested_size", "stream", "segment_type",
        "frames", "blocks", "state", "size", "time_us", "action", "addr", "device", "filename", "line", "name")
MAX_ROWS = 50
"""Each seed's lists are cut to this many entries first: the reader's cost is per row, the
shapes it meets are the same."""


NEST_LIMIT = 500
"""Deepest nesting a case builds; ``pickle.dumps`` spends about two levels of Python's recursion
limit per level of nesting, so :func:`materialize_snapshot` raises that limit while it pickles."""


def snapshot_seeds() -> list[str]:
    return [s for s in SNAPSHOT_SEEDS if (SHARED_TRACES / s).is_file()]


@lru_cache(maxsize=None)
def _seed(seed: str) -> Any:
    from stepscope.collector.memory_snapshot import load_snapshot

    snap = load_snapshot(SHARED_TRACES / seed)
    snap["segments"] = snap["segments"][:MAX_ROWS]
    snap["device_traces"] = [t[:MAX_ROWS] for t in snap.get("device_traces") or []]
    return snap


@dataclass(frozen=True)
class SnapshotCase:
    seed: str
    ops: tuple[tuple[Any, ...], ...]
    protocol: int
    edits: tuple[tuple[str, int, int], ...]

    def describe(self) -> str:
        return f"SnapshotCase(seed={self.seed!r}, ops={self.ops!r}, protocol={self.protocol}, edits={self.edits!r})"


_index = st.integers(min_value=0, max_value=2**20)
SNAPSHOT_OPS = st.one_of(
    st.tuples(st.just("set"), st.integers(0, 3), _index, st.sampled_from(KEYS), st.sampled_from(range(len(VALUES)))),
    st.tuples(st.just("delete"), st.integers(0, 3), _index, st.sampled_from(KEYS)),
    st.tuples(st.just("truncate_list"), st.integers(0, 3), _index, st.integers(0, 3)),
    st.tuples(st.just("replace_root"), st.sampled_from(range(len(VALUES)))),
)


@st.composite
def snapshot_cases(draw: st.DrawFn) -> SnapshotCase:
    seed = draw(st.sampled_from(snapshot_seeds()))
    ops = tuple(draw(st.lists(SNAPSHOT_OPS, max_size=4)))
    edits = draw(st.one_of(st.just(()), st.just(()), st.tuples(st.tuples(
        st.sampled_from(("flip", "truncate", "insert", "delete")), _index, st.integers(0, 255)))))
    return SnapshotCase(seed, ops, draw(st.sampled_from((2, 4, 5))), edits)


def _dicts(snap: Any) -> list[list[dict[str, Any]]]:
    """The snapshot's objects by level: the root, segments, blocks and history entries, frames."""
    if not isinstance(snap, dict):
        return [[], [], [], []]
    segs = [s for s in snap.get("segments") or [] if isinstance(s, dict)] if isinstance(snap.get("segments"), list) else []
    blocks = [b for s in segs if isinstance(s.get("blocks"), list) for b in s["blocks"] if isinstance(b, dict)]
    traces = snap.get("device_traces") if isinstance(snap.get("device_traces"), list) else []
    entries = [e for t in traces if isinstance(t, list) for e in t if isinstance(e, dict)]
    frames = [f for x in blocks + entries if isinstance(x.get("frames"), list) for f in x["frames"] if isinstance(f, dict)]
    return [[snap], segs, blocks + entries, frames]


def _nest(value: Any) -> Any:
    """A marker of ``VALUES`` as plain data: deep nesting as nested lists, raw bytes as bytes."""
    if isinstance(value, str) and value.startswith("\x00fuzz-nest:"):
        out: list[Any] = []
        for _ in range(min(int(value.rpartition(":")[2]), NEST_LIMIT)):
            out = [out]
        return out
    if isinstance(value, str) and value.startswith("\x00fuzz-raw:"):
        return value.encode()
    return copy.deepcopy(value)


def apply_snapshot_op(snap: Any, op: tuple[Any, ...]) -> Any:
    kind, *p = op
    if kind == "replace_root":
        return _nest(VALUES[p[0]])
    level = _dicts(snap)[p[0]]
    if not level:
        return snap
    target = level[p[1] % len(level)]
    if kind == "set":
        target[p[2]] = _nest(VALUES[p[3]])
    elif kind == "delete":
        target.pop(p[2], None)
    elif kind == "truncate_list":
        lists = [k for k, v in target.items() if isinstance(v, list)]
        if lists:
            key = lists[p[1] % len(lists)]
            target[key] = target[key][:p[2]]
    return snap


def materialize_snapshot(case: SnapshotCase) -> bytes:
    snap = copy.deepcopy(_seed(case.seed))
    for op in case.ops:
        snap = apply_snapshot_op(snap, op)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * NEST_LIMIT + 1000))
    try:
        data = pickle.dumps(snap, protocol=case.protocol)
    finally:
        sys.setrecursionlimit(limit)
    for edit in case.edits:
        data = _edit(data, edit)
    return data


def check_snapshot(path: Path) -> tuple[str, list[str], str | None]:
    """(``read``, ``refused`` or ``crashed``; failures; the refusal's reason class, for counting
    refusals by reason) of the reader on one file."""
    from stepscope.collector.memory_snapshot import load_snapshot, snapshot_table
    from stepscope.errors import TraceFormatError
    from tests.fuzz_oracle import reason_class

    try:
        snapshot_table(load_snapshot(path), "fuzz", str(path))
    except TraceFormatError as exc:
        line = str(exc)
        problems = [] if line.startswith(f"{path}: ") and "\n" not in line else [f"refusal is not one line naming the file: {line[:300]}"]
        return "refused", problems, reason_class(line, path)
    except Exception as exc:  # noqa: BLE001
        return "crashed", [f"snapshot reader raised {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"], None
    return "read", [], None
