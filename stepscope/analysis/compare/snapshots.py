"""Two memory snapshots side by side: the peak, the reserved memory, and the user frames whose
live bytes at the peak moved most (``stepscope compare`` on runs holding snapshots).

Each side's figures are its ``snapshot`` section's (``stepscope.analysis.snapshot``, definitions
in docs/ANALYSIS.md, "Memory snapshots"), every user frame live at the peak listed. Snapshots are
paired by rank and device: one run's rank 0 device 0 against the other's. A rank and device only
one side holds is listed as unpaired, never compared with zero; a side holding several
snapshots of one rank and device is compared by its first (by source id) and says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stepscope.analysis.absent import Absent, Maybe
from stepscope.analysis.sections import SQLStore
from stepscope.analysis.snapshot import every_frame_at_peak

TOP_FRAMES = 10
"""Frames listed per pair: the largest moves of live bytes at the peak, either way."""

Refs = Sequence[tuple[SQLStore, str]]


def _change(base: int | None, cand: int | None) -> dict[str, Any]:
    delta = None if base is None or cand is None else cand - base
    return {"baseline": base, "candidate": cand, "delta": delta,
            "delta_pct": None if delta is None or not base else 100.0 * delta / base}


def _firsts(records: Maybe[Any]) -> tuple[dict[tuple[int, int], dict[str, Any]], list[tuple[int, int]]]:
    """Each (rank, device)'s first record, and the (rank, device)s held more than once."""
    if isinstance(records, Absent):
        return {}, []
    out: dict[tuple[int, int], dict[str, Any]] = {}
    again: list[tuple[int, int]] = []
    for r in sorted(records.snapshots, key=lambda r: (r["rank"], r["device"], r["source"])):
        key = (r["rank"], r["device"])
        if key in out:
            again.append(key)
        else:
            out[key] = r
    return out, again


def _frames(base: dict[str, Any], cand: dict[str, Any]) -> list[dict[str, Any]]:
    def live(record: dict[str, Any]) -> dict[str, int]:
        return {g["frame"]: g["bytes"] for g in record["live_at_peak"] or []}

    b, c = live(base), live(cand)
    rows = [{"frame": f, "baseline_bytes": b.get(f, 0), "candidate_bytes": c.get(f, 0),
             "delta_bytes": c.get(f, 0) - b.get(f, 0)} for f in b.keys() | c.keys()]
    rows = [r for r in rows if r["delta_bytes"]]
    rows.sort(key=lambda r: (-abs(r["delta_bytes"]), r["frame"]))
    return rows[:TOP_FRAMES]


def _pair(rank: int, device: int, base: dict[str, Any], cand: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "rank": rank, "device": device, "baseline_source": base["source"], "candidate_source": cand["source"],
        "peak_allocated_bytes": _change(base["peak_allocated_bytes"], cand["peak_allocated_bytes"]),
        "reserved_at_peak_bytes": _change(base["reserved_at_peak_bytes"], cand["reserved_at_peak_bytes"]),
        "reserved_bytes": _change(base["reserved"]["reserved_bytes"], cand["reserved"]["reserved_bytes"]),
        "segments": _change(base["reserved"]["segments"], cand["reserved"]["segments"]),
        "oom": {"baseline": base["oom"] is not None, "candidate": cand["oom"] is not None},
        "frames": _frames(base, cand),
    }
    if base["live_at_peak"] is None or cand["live_at_peak"] is None:
        out["absent_reasons"] = {"frames": "a snapshot holds no history: no peak to compare"}
    return out


def compare_snapshots(base: Refs, cand: Refs) -> dict[str, Any] | None:
    """The snapshots of the baseline's newest run against the candidate's first run (JSON-ready,
    docs/COMPARE_JSON.md ``snapshots``); None when neither holds one (a comparison of traces
    only, whose report stays as it was)."""
    if not base or not cand:
        return None
    (b_store, b_run), (c_store, c_run) = base[-1], cand[0]
    b_records, c_records = every_frame_at_peak(b_store, b_run), every_frame_at_peak(c_store, c_run)
    if isinstance(b_records, Absent) and isinstance(c_records, Absent):
        return None
    (b, b_again), (c, c_again) = _firsts(b_records), _firsts(c_records)
    pairs = [_pair(rank, device, b[(rank, device)], c[(rank, device)]) for rank, device in sorted(b.keys() & c.keys())]
    unpaired = ([{"side": "baseline", "rank": r, "device": d} for r, d in sorted(b.keys() - c.keys())]
                + [{"side": "candidate", "rank": r, "device": d} for r, d in sorted(c.keys() - b.keys())])
    several = ([{"side": "baseline", "rank": r, "device": d} for r, d in b_again]
               + [{"side": "candidate", "rank": r, "device": d} for r, d in c_again])
    return {"baseline_run": b_run, "candidate_run": c_run, "pairs": pairs, "unpaired": unpaired,
            "several_snapshots": several}
