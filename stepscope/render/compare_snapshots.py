"""The memory snapshots of a comparison as tables (from the JSON contract's ``snapshots``): per
rank and device, the peak and the reserved memory, then the frames whose live bytes at the peak
moved most. No table when neither run holds a snapshot."""

from __future__ import annotations

from typing import Any

from stepscope.render.table import Table
from stepscope.units import format_delta, format_value, signed_percent

_FIGURES = (("peak_allocated_bytes", "peak allocated"), ("reserved_at_peak_bytes", "reserved at the peak"),
            ("reserved_bytes", "reserved when taken"))


def snapshot_tables(doc: dict[str, Any]) -> list[Table]:
    """The snapshot tables of the comparison ``doc`` (empty when it holds no snapshot)."""
    snapshots = doc.get("snapshots")
    if not snapshots:
        return []
    tables = []
    for p in snapshots["pairs"]:
        where = f"rank {p['rank']} device {p['device']}"
        rows = [[label, format_value(p[key]["baseline"], "bytes"), format_value(p[key]["candidate"], "bytes"),
                 format_delta(p[key]["delta"], "bytes"), signed_percent(p[key]["delta_pct"])] for key, label in _FIGURES]
        rows.append(["segments", p["segments"]["baseline"], p["segments"]["candidate"],
                     format_delta(p["segments"]["delta"], "count"), signed_percent(p["segments"]["delta_pct"])])
        oom = {True: "yes", False: "no"}
        rows.append(["ran out of memory", oom[p["oom"]["baseline"]], oom[p["oom"]["candidate"]], "", ""])
        tables.append(Table.of_text(f"Memory snapshot, {where}", ["figure", "baseline", "candidate", "delta", "change"],
                                    rows, "from each run's allocator snapshot (docs/ANALYSIS.md, Memory snapshots)"))
        frames = [[f["frame"], format_value(f["baseline_bytes"], "bytes"), format_value(f["candidate_bytes"], "bytes"),
                   format_delta(f["delta_bytes"], "bytes")] for f in p["frames"]]
        tables.append(Table.of_text(f"Frames live at the peak, {where} (largest changes)",
                                    ["user frame", "baseline", "candidate", "delta"], frames,
                                    None if frames else p.get("absent_reasons", {}).get("frames", "no frame moved")))
    if snapshots["unpaired"] or snapshots["several_snapshots"]:
        rows = [[u["side"], u["rank"], u["device"], "only this side holds a snapshot of it"] for u in snapshots["unpaired"]]
        rows += [[u["side"], u["rank"], u["device"], "several snapshots: the first (by source id) is compared"]
                 for u in snapshots["several_snapshots"]]
        tables.append(Table.of_text("Memory snapshots not compared", ["side", "rank", "device", "why"], rows))
    return tables
