"""Memory: allocated/reserved over time with step boundaries and the peak, roles, largest allocations."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from stepscope.analysis.breakdown import step_windows
from stepscope.analysis.memory import memory_section, memory_timeline
from stepscope.dashboard._data import context
from stepscope.dashboard._filters import select
from stepscope.dashboard._snapshot_view import snapshot_part
from stepscope.dashboard._view import GIB, NS_PER_MS, chart, data_table, frame, guarded, ns_to_ms, shown, with_units

ctx = context()
st.title(f"Memory: {ctx.run}")

with guarded("Memory"):
    result = ctx.section(memory_section)
    timeline = ctx.analysis(memory_timeline)
    if shown(result, "Memory") and shown(timeline, "Memory timeline"):
        timeline = select(frame(timeline), ctx, step=None)
        timeline = timeline[timeline["ts_ns"].notna()]
        # The device number -1 (or none) is the host's: no index to show.
        device = timeline["device"].astype("Int64")
        timeline["device_key"] = device.fillna(-1)
        timeline["device_label"] = timeline["device_name"] + device.map(
            lambda d: "" if pd.isna(d) or d < 0 else f" {d}").astype(str)
        # Accelerator memory first (CUDA, HIP, ...): that is the memory people run out of.
        series = timeline[["rank", "device_type", "device_key", "device_label", "accelerator"]].drop_duplicates(
            ["rank", "device_type", "device_key"]).sort_values(["accelerator", "rank", "device_key"],
                                                               ascending=[False, True, True])
        labels = [f"rank {r.rank}, {r.device_label}" for r in series.itertuples()]
        if not labels:
            st.info("No memory events on the selected ranks.")
        else:
            pick = st.selectbox("Rank and device", range(len(labels)), format_func=labels.__getitem__, key="memory_series")
            chosen = series.iloc[pick]
            key = (timeline["rank"] == chosen["rank"]) & (timeline["device_type"] == chosen["device_type"]) & \
                  (timeline["device_key"] == chosen["device_key"])
            data = timeline[key]
            if data["rebuilt"].any():
                st.caption("These [memory] events carry no Total Allocated/Reserved: allocated memory is rebuilt from "
                           "their Bytes deltas (since the trace began); reserved memory is unknown.")
            origin = int(data["ts_ns"].min())
            long = data.melt(id_vars=["ts_ns"], value_vars=["total_allocated", "total_reserved"],
                             var_name="counter", value_name="bytes")
            long["counter"] = long["counter"].map({"total_allocated": "allocated", "total_reserved": "reserved"})
            long["gib"] = long["bytes"] / GIB
            long["t_ms"] = (long["ts_ns"] - origin) / NS_PER_MS
            layers = [alt.Chart(long).mark_line(interpolate="step-after").encode(
                x=alt.X("t_ms:Q", title="time since the rank's first memory event (ms)"),
                y=alt.Y("gib:Q", title="memory (GiB)"),
                color=alt.Color("counter:N", title="allocator", scale=alt.Scale(range=["#4C78A8", "#F58518"])),
                tooltip=[alt.Tooltip("counter:N"), alt.Tooltip("t_ms:Q", title="time (ms)", format=",.3f"),
                         alt.Tooltip("gib:Q", title="GiB", format=",.4f")],
            )]
            windows = ctx.analysis(step_windows)
            if shown(windows, "Step boundaries"):
                bounds = select(frame(windows), ctx)
                bounds = bounds[bounds["rank"] == chosen["rank"]].copy()
                bounds["t_ms"] = (bounds["cpu_start_ns"] - origin) / NS_PER_MS
                bounds = bounds[(bounds["t_ms"] >= 0) & (bounds["t_ms"] <= long["t_ms"].max())]
                layers.append(alt.Chart(bounds).mark_rule(color="gray", strokeDash=[4, 4]).encode(
                    x="t_ms:Q", tooltip=[alt.Tooltip("step:O", title="step starts"),
                                         alt.Tooltip("t_ms:Q", title="time (ms)", format=",.3f")]))
            live = frame(result.live_at_peak)
            peak = live[(live["rank"] == chosen["rank"]) & (live["device_type"] == chosen["device_type"])][
                ["peak_ts_ns", "peak_allocated_bytes"]].drop_duplicates()
            if not peak.empty:
                peak = peak.assign(t_ms=(peak["peak_ts_ns"] - origin) / NS_PER_MS, gib=peak["peak_allocated_bytes"] / GIB)
                layers.append(alt.Chart(peak).mark_point(shape="triangle-down", size=160, filled=True, color="#E45756")
                              .encode(x="t_ms:Q", y="gib:Q",
                                      tooltip=[alt.Tooltip("gib:Q", title="peak allocated (GiB)", format=",.4f"),
                                               alt.Tooltip("t_ms:Q", title="time (ms)", format=",.3f")]))
            chart(alt.layer(*layers).properties(height=340))
            st.caption("Dashed lines: steps start. Red triangle: the highest allocated peak. Each point keeps the "
                       "maximum of its time bucket, so no peak is lost.")

        st.subheader("Peak per step")
        peaks = with_units(ns_to_ms(select(frame(result.peaks), ctx)),
                           {"peak_allocated_gib": ("peak_allocated_bytes", GIB),
                            "peak_reserved_gib": ("peak_reserved_bytes", GIB),
                            "capacity_gib": ("capacity_bytes", GIB)})
        data_table(peaks)

        st.subheader("By role at the peak")
        if shown(result.roles, "Roles"):
            roles = with_units(select(frame(result.roles), ctx, step=None), {"live_gib": ("live_bytes", GIB),
                                                                             "recorded_gib": ("recorded_bytes", GIB)})
            chart(alt.Chart(roles).mark_bar().encode(
                x=alt.X("live_gib:Q", title="live at the peak (GiB)", stack="zero"),
                y=alt.Y("rank:O", title="rank"),
                color=alt.Color("role:N", title="role"),
                tooltip=[alt.Tooltip("rank:O"), alt.Tooltip("role:N"), alt.Tooltip("live_gib:Q", title="GiB", format=",.4f"),
                         alt.Tooltip("allocations:Q")],
            ).properties(height=max(120, min(720, 30 * roles["rank"].nunique()))))
            data_table(roles)

        st.subheader("Largest allocations live at the peak")
        live = with_units(ns_to_ms(select(frame(result.live_at_peak), ctx, step=None)), {"gib": ("bytes", GIB)})
        data_table(live)
        if shown(result.snapshot, "Allocator snapshot"):
            st.subheader("CUDA allocator snapshot")
            data_table(select(frame(result.snapshot), ctx, step=None))

with guarded("Memory snapshot"):
    snapshot_part(ctx)
