"""The Memory page's part for an ingested CUDA memory snapshot (``stepscope ingest x.pickle``).

What a user handed the pickle of an OOM looks for first comes first: the findings (the OOM, its
cause and the frames holding the memory; fragmentation; activations) in words, then the
allocated and reserved curve over the history with the peak (and the OOM) marked, the user
frames live at the peak as a sorted bar chart, the OOM's live frames, and the segments. Every
figure is the analysis layer's (``stepscope.analysis.snapshot``)."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from stepscope.analysis.absent import Absent
from stepscope.analysis.findings import RULES, Severity, evaluate
from stepscope.analysis.snapshot import snapshot_section, snapshot_segments
from stepscope.dashboard._view import GIB, chart, data_table, frame

_RULES = ("memory.oom", "memory.fragmentation", "memory.activations")
_SAY = {Severity.CRITICAL: st.error, Severity.WARNING: st.warning}


def _frames_chart(groups: list[dict[str, Any]], title: str) -> None:
    bars = pd.DataFrame(groups).assign(gib=lambda d: d["bytes"] / GIB)
    chart(alt.Chart(bars).mark_bar().encode(
        x=alt.X("gib:Q", title=title), y=alt.Y("frame:N", title="user frame", sort="-x"),
        tooltip=[alt.Tooltip("frame:N"), alt.Tooltip("gib:Q", title="GiB", format=",.4f"),
                 alt.Tooltip("bytes:Q", format=","), alt.Tooltip("allocations:Q")],
    ).properties(height=max(120, 28 * len(bars))))


def _curve(record: dict[str, Any]) -> None:
    curve = pd.DataFrame(record["curve"])
    long = curve.melt(id_vars=["seq"], value_vars=["allocated_max", "reserved_max"], var_name="counter",
                      value_name="bytes")
    long["counter"] = long["counter"].map({"allocated_max": "allocated", "reserved_max": "reserved"})
    long["gib"] = long["bytes"] / GIB
    layers = [alt.Chart(long).mark_line(interpolate="step-after").encode(
        x=alt.X("seq:Q", title="history event"), y=alt.Y("gib:Q", title="memory (GiB)"),
        color=alt.Color("counter:N", title="allocator", scale=alt.Scale(range=["#4C78A8", "#F58518"])),
        tooltip=[alt.Tooltip("counter:N"), alt.Tooltip("seq:Q", title="event"),
                 alt.Tooltip("gib:Q", title="GiB", format=",.4f")])]
    peak = pd.DataFrame([{"seq": record["peak_seq"], "gib": record["peak_allocated_bytes"] / GIB}])
    layers.append(alt.Chart(peak).mark_point(shape="triangle-down", size=160, filled=True, color="#E45756").encode(
        x="seq:Q", y="gib:Q", tooltip=[alt.Tooltip("gib:Q", title="peak allocated (GiB)", format=",.4f"),
                                       alt.Tooltip("seq:Q", title="event")]))
    if record["oom"] is not None:
        oom = pd.DataFrame([{"seq": record["oom"]["seq"]}])
        layers.append(alt.Chart(oom).mark_rule(color="#E45756", strokeDash=[4, 4]).encode(
            x="seq:Q", tooltip=[alt.Tooltip("seq:Q", title="out of memory at event")]))
    chart(alt.layer(*layers).properties(height=320))
    st.caption("Red triangle: the allocated peak; dashed red line: the out-of-memory event. Each point keeps the "
               "highest value of its bucket of events, so no peak is lost.")


def snapshot_part(ctx: Any) -> None:
    """The snapshot part of the Memory page for ``ctx``'s run; nothing when it holds none."""
    result = ctx.section(snapshot_section)
    if isinstance(result, Absent):
        return
    st.header("Memory snapshot")
    for finding in evaluate({"snapshot": result}, [RULES[r] for r in _RULES]):
        _SAY.get(finding.severity, st.info)(finding.message)
    records = list(result.snapshots)
    labels = [f"rank {r['rank']}, device {r['device']} ({r['source']})" for r in records]
    pick = st.selectbox("Snapshot", range(len(records)), format_func=labels.__getitem__, key="snapshot_pick") \
        if len(records) > 1 else 0
    record = records[pick]
    reserved = record["reserved"]
    st.dataframe(pd.DataFrame([{
        "peak_allocated_bytes": record["peak_allocated_bytes"], "reserved_at_peak_bytes": record["reserved_at_peak_bytes"],
        "reserved_bytes": reserved["reserved_bytes"], "allocated_bytes": reserved["allocated_bytes"],
        "segments": reserved["segments"], "largest_free_block_bytes": reserved["largest_free_block_bytes"],
        "events": record["events"]}]), hide_index=True)
    if record["peak_seq"] is None:
        st.info(f"Curve: {record['absent_reasons']['peak_seq']}")
    else:
        _curve(record)
        st.subheader("Live at the peak, by user frame")
        _frames_chart(record["live_at_peak"], "live at the peak (GiB)")
        data_table(pd.DataFrame(record["live_at_peak"]))
    if record["oom"] is not None:
        oom = record["oom"]
        st.subheader("Out of memory")
        st.dataframe(pd.DataFrame([{k: oom[k] for k in ("request_bytes", "allocated_bytes", "reserved_bytes",
                                                         "reserved_unallocated_bytes", "cause", "seq")}]),
                     hide_index=True)
        _frames_chart(oom["live_by_frame"], "live when it ran out (GiB)")
    st.subheader("Segments when the snapshot was taken")
    segments = ctx.analysis(snapshot_segments)
    if not isinstance(segments, Absent):
        segs = frame(segments)
        segs = segs[(segs["rank"] == record["rank"]) & (segs["source"] == record["source"])
                    & (segs["device"] == record["device"])].reset_index(drop=True)
        segs["segment"] = segs.index.astype(str)
        bars = segs.melt(id_vars=["segment"], value_vars=["allocated_bytes", "free_bytes"], var_name="part",
                         value_name="bytes").assign(gib=lambda d: d["bytes"] / GIB)
        chart(alt.Chart(bars).mark_bar().encode(
            x=alt.X("segment:O", sort=None, title="segment (largest first)", axis=alt.Axis(labels=False)),
            y=alt.Y("gib:Q", title="GiB", stack="zero"), color=alt.Color("part:N", title="bytes"),
            tooltip=[alt.Tooltip("segment:O"), alt.Tooltip("part:N"), alt.Tooltip("gib:Q", format=",.4f")],
        ).properties(height=240))
        data_table(segs.drop(columns=["segment"]))
