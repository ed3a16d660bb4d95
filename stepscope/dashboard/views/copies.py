"""Offload & copies: host<->device traffic per step, bandwidth against the link, overlap, pinning."""

from __future__ import annotations

import altair as alt
import streamlit as st

from stepscope.analysis.copies import copies_section, copy_events
from stepscope.dashboard._data import context
from stepscope.dashboard._filters import select
from stepscope.dashboard._view import GIB, chart, data_table, frame, guarded, ns_to_ms, shown, with_units

ctx = context()
st.title(f"Offload & copies: {ctx.run}")

with guarded("Offload & copies"):
    result = ctx.section(copies_section)
    if shown(result, "Copies"):
        totals = with_units(ns_to_ms(select(frame(result.totals), ctx, step=None)), {"gib": ("bytes", GIB)})
        totals = totals.drop(columns=["step"], errors="ignore")  # per-rank totals: no step
        per_step = with_units(ns_to_ms(select(frame(result.per_step), ctx)), {"gib": ("bytes", GIB)})
        per_step = per_step[per_step["step"].notna()]
        per_step["memory"] = per_step["direction"] + " " + per_step["host_memory"].fillna("device")
        totals["memory"] = totals["direction"] + " " + totals["host_memory"].fillna("device")

        st.subheader("Totals per rank, direction and host memory")
        st.caption("Bandwidth: bytes over copy time (GB/s = 1e9 bytes/s); p10/p50/p90 over single copies; "
                   "hidden: the part of the copy time under compute kernels.")
        data_table(totals)

        st.subheader("Per step")
        ranks = sorted(per_step["rank"].unique())
        if not ranks:
            st.info("No copy falls inside a profiled step of the selected ranks and steps.")
        else:
            rank = st.selectbox("Rank", ranks, key="copies_rank")
            data = per_step[per_step["rank"] == rank]
            tooltip = [alt.Tooltip("step:O"), alt.Tooltip("direction:N"), alt.Tooltip("host_memory:N", title="host memory"),
                       alt.Tooltip("count:Q", title="copies"), alt.Tooltip("gib:Q", title="GiB", format=",.4f"),
                       alt.Tooltip("bandwidth_gbps:Q", title="bandwidth (GB/s)", format=",.2f"),
                       alt.Tooltip("hidden_pct:Q", title="hidden under compute (%)", format=".1f")]
            left, right = st.columns(2)
            with left:
                chart(alt.Chart(data, title=f"rank {rank}: bytes copied per step").mark_bar().encode(
                    x=alt.X("step:O", title="step", axis=alt.Axis(labelAngle=0)),
                    y=alt.Y("gib:Q", title="copied (GiB)", stack="zero"),
                    color=alt.Color("memory:N", title="direction, host memory"), tooltip=tooltip,
                ).properties(height=300))
            with right:
                chart(alt.Chart(data, title=f"rank {rank}: bandwidth per step").mark_line(point=True).encode(
                    x=alt.X("step:O", title="step", axis=alt.Axis(labelAngle=0)),
                    y=alt.Y("bandwidth_gbps:Q", title="bandwidth (GB/s)"),
                    color=alt.Color("memory:N", title="direction, host memory"), tooltip=tooltip,
                ).properties(height=300))
            hidden = data.melt(id_vars=["step", "memory"], value_vars=["hidden_ms", "exposed_ms"],
                               var_name="part", value_name="ms")
            hidden["part"] = hidden["part"].map({"hidden_ms": "hidden under compute", "exposed_ms": "exposed"})
            chart(alt.Chart(hidden, title=f"rank {rank}: copy time hidden under compute").mark_bar().encode(
                x=alt.X("step:O", title="step", axis=alt.Axis(labelAngle=0)),
                xOffset=alt.XOffset("memory:N"),
                y=alt.Y("ms:Q", title="copy time (ms)", stack="zero"),
                color=alt.Color("part:N", title="copy time", scale=alt.Scale(domain=["hidden under compute", "exposed"],
                                                                              range=["#54A24B", "#E45756"])),
                tooltip=[alt.Tooltip("step:O"), alt.Tooltip("memory:N", title="direction, host memory"),
                         alt.Tooltip("part:N"), alt.Tooltip("ms:Q", title="time (ms)", format=",.3f")],
            ).properties(height=260))
            with st.expander("Per-step table"):
                data_table(data.drop(columns=["memory"]))

        st.subheader("Bandwidth of each copy against the link's peak")
        events = ctx.analysis(copy_events)
        if shown(events, "Copies"):
            events = select(frame(events), ctx)
            events = events[events["bandwidth_gbps"].notna() & events["direction"].isin(["h2d", "d2h"])].copy()
            if events.empty:
                st.info("No host<->device copy with a nonzero duration in the selection.")
            else:
                events["memory"] = events["direction"] + " " + events["host_memory"].fillna("unknown")
                events["mib"] = events["bytes"] / 1024**2
                events["dur_ms"] = events["dur_ns"] / 1e6
                ticks = alt.Chart(events).mark_tick(thickness=2, size=18, opacity=0.5).encode(
                    x=alt.X("bandwidth_gbps:Q", title="bandwidth (GB/s)"),
                    y=alt.Y("memory:N", title=None),
                    color=alt.Color("memory:N", legend=None),
                    tooltip=[alt.Tooltip("rank:O"), alt.Tooltip("step:O"), alt.Tooltip("memory:N"),
                             alt.Tooltip("mib:Q", title="size (MiB)", format=",.3f"),
                             alt.Tooltip("dur_ms:Q", title="time (ms)", format=",.4f"),
                             alt.Tooltip("bandwidth_gbps:Q", title="bandwidth (GB/s)", format=",.2f"),
                             alt.Tooltip("pct_of_peak:Q", title="% of link peak", format=".1f"),
                             alt.Tooltip("name:N")],
                )
                peaks = events[events["peak_gbps"].notna()][["link", "peak_gbps"]].drop_duplicates()
                layers = [ticks]
                if not peaks.empty:
                    layers.append(alt.Chart(peaks).mark_rule(color="black", strokeDash=[6, 3]).encode(
                        x="peak_gbps:Q", tooltip=[alt.Tooltip("link:N"), alt.Tooltip("peak_gbps:Q", title="peak (GB/s)")]))
                    layers.append(alt.Chart(peaks).mark_text(align="left", dx=4, dy=-6, baseline="bottom").encode(
                        x="peak_gbps:Q", y=alt.value(0), text=alt.Text("link:N")))
                chart(alt.layer(*layers).properties(height=max(140, 60 * events["memory"].nunique())))
                reasons = sorted(set(events.loc[events["peak_gbps"].isna(), "absent_reason"].dropna()))
                if reasons:
                    st.caption("No link peak drawn: " + "; ".join(reasons))
