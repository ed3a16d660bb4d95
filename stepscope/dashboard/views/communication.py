"""Communication: collectives, bus bandwidth against message size, arrival skew, late ranks."""

from __future__ import annotations

import altair as alt
import streamlit as st

from stepscope.analysis.absent import Absent
from stepscope.analysis.comm import arrival_skew, collective_kernels, comm_section
from stepscope.dashboard._data import context
from stepscope.dashboard._filters import select
from stepscope.dashboard._view import bar_width, chart, data_table, frame, guarded, ns_to_ms, shown

ctx = context()
st.title(f"Communication: {ctx.run}")

result = Absent("the section raised")
with guarded("Communication"):
    result = ctx.section(comm_section)
if shown(result, "Communication"):
    st.subheader("Collectives")
    with guarded("Collectives"):
        st.caption("Per rank, collective and message size (nccl-tests size S). Exposed: not under compute kernels. "
                   "Bandwidths are total bytes over total time, GB/s = 1e9 bytes/s.")
        by_collective = ns_to_ms(select(frame(result.by_collective), ctx))
        data_table(by_collective)

        with st.expander("By process group and phase"):
            data_table(ns_to_ms(select(frame(result.by_group_phase), ctx)))

    st.subheader("Bus bandwidth against message size")
    with guarded("Bus bandwidth against message size"):
        kernels = ctx.analysis(collective_kernels)
        if shown(kernels, "Collective kernels"):
            kernels = select(frame(kernels), ctx)
            sized = kernels[kernels["busbw_gbps"].notna() & (kernels["bytes"] > 0)].copy()
            if sized.empty:
                reasons = sorted(set(kernels["absent_reason"].dropna()))
                st.info("No collective with a known size and bus-bandwidth factor"
                        + (f": {'; '.join(reasons)}" if reasons else "."), icon=":material/info:")
            else:
                sized["size_mib"] = sized["bytes"] / 1024**2
                sized["dur_ms"] = sized["dur_ns"] / 1e6
                chart(alt.Chart(sized).mark_circle(opacity=0.6, size=40).encode(
                    x=alt.X("size_mib:Q", title="message size (MiB, log scale)", scale=alt.Scale(type="log")),
                    y=alt.Y("busbw_gbps:Q", title="bus bandwidth (GB/s)"),
                    color=alt.Color("collective:N", title="collective"),
                    tooltip=[alt.Tooltip("rank:O"), alt.Tooltip("step:O"), alt.Tooltip("collective:N"),
                             alt.Tooltip("size_mib:Q", title="size (MiB)", format=",.3f"),
                             alt.Tooltip("dur_ms:Q", title="time (ms)", format=",.3f"),
                             alt.Tooltip("busbw_gbps:Q", title="busbw (GB/s)", format=",.2f"),
                             alt.Tooltip("algbw_gbps:Q", title="algbw (GB/s)", format=",.2f"),
                             alt.Tooltip("pg_desc:N", title="process group")],
                ).properties(height=340))
                st.caption(f"{len(sized):,} kernels of the selected ranks and steps; "
                           f"{len(kernels) - len(sized):,} without a size or factor are not drawn.")

    st.subheader("Arrival skew: rank x collective")
    with guarded("Arrival skew: rank x collective"):
        skew = ctx.analysis(arrival_skew)
        if shown(skew, "Arrival skew per rank and collective"):
            skew = ns_to_ms(select(frame(skew), ctx))
        if not isinstance(skew, Absent) and skew.empty:
            st.info("No collective instance was matched on two or more of the selected ranks.", icon=":material/info:")
        elif not isinstance(skew, Absent):
            chart(alt.Chart(skew).mark_rect().encode(
                x=alt.X("collective:N", title="collective", axis=alt.Axis(labelAngle=0)),
                y=alt.Y("rank:O", title="rank"),
                color=alt.Color("mean_late_ms:Q", title="mean late arrival (ms)", scale=alt.Scale(scheme="orangered")),
                tooltip=[alt.Tooltip("rank:O"), alt.Tooltip("collective:N"), alt.Tooltip("instances:Q"),
                         alt.Tooltip("mean_late_ms:Q", title="mean late (ms)", format=",.3f"),
                         alt.Tooltip("max_late_ms:Q", title="max late (ms)", format=",.3f"),
                         alt.Tooltip("last_count:Q", title="started last")],
            ).properties(height=max(160, min(720, 18 * skew["rank"].nunique()))))
            st.caption("Late: the rank's start minus the earliest start of the same collective instance.")
            with st.expander("Lateness per rank and collective"):
                data_table(skew)
        if not isinstance(result.skew, Absent):
            with st.expander("Skew per process group and collective (instances matched across ranks)", expanded=True):
                data_table(ns_to_ms(frame(result.skew)))
        else:
            shown(result.skew, "Cross-rank skew")

    st.subheader("Last arrivals and late ranks")
    with guarded("Last arrivals and late ranks"):
        if shown(result.arrivals, "Last arrivals"):
            arrivals = ns_to_ms(select(frame(result.arrivals), ctx))
        if not isinstance(result.arrivals, Absent) and arrivals.empty:
            st.info("No collective (point-to-point transfers aside: a pipeline makes one side wait by design) "
                    "was matched on two or more of the selected ranks: no last arrivals to count.",
                    icon=":material/info:")
        elif not isinstance(result.arrivals, Absent):
            chart(alt.Chart(arrivals).mark_bar(size=bar_width(len(arrivals))).encode(
                x=alt.X("rank:O", title="rank", axis=alt.Axis(labelAngle=0, labelOverlap=True)),
                y=alt.Y("last_pct:Q", title="arrived last (%)"),
                tooltip=[alt.Tooltip("rank:O"), alt.Tooltip("instances:Q"), alt.Tooltip("last_count:Q"),
                         alt.Tooltip("last_pct:Q", title="last (%)", format=".1f"),
                         alt.Tooltip("mean_late_ms:Q", title="mean late (ms)", format=",.3f"),
                         alt.Tooltip("steps_last_most:Q", title="steps last most often")],
            ).properties(height=260))
            data_table(arrivals)
        if shown(result.compute, "Compute per rank"):
            st.caption("Compute per rank: a compute straggler hides inside the collectives' waits.")
            data_table(ns_to_ms(select(frame(result.compute), ctx)))
        if shown(result.clock_offsets, "Clock offsets"):
            st.caption("Clock offsets: each rank's clock against the reference rank's, from the end times of "
                       "matched collectives (they end together); corrected when larger than their spread.")
            data_table(ns_to_ms(select(frame(result.clock_offsets), ctx)))
        suspects = [f for f in ctx.findings() if f["rule"] == "comm.late_rank"]
        for f in suspects:
            st.warning(f["message"], icon=":material/warning:")
