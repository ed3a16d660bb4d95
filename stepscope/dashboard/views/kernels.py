"""Kernels & ops: the GPU work and CPU operators with the most time, launch overhead, step times."""

from __future__ import annotations

import altair as alt
import streamlit as st

from stepscope.analysis.kernels import launch_overhead, step_stats, top_cpu_ops, top_kernels
from stepscope.dashboard._data import context
from stepscope.dashboard._filters import select
from stepscope.dashboard._view import bar_width, chart, data_table, frame, guarded, ns_to_ms, shown
from stepscope.units import short_name

TOP = 20

ctx = context()
st.title(f"Kernels & ops: {ctx.run}")
st.caption("Counted over the profiled steps (the whole trace when it has none). The step range does not "
           "apply here: these are per-rank totals.")


def top_chart(df, title: str) -> None:
    """Horizontal bars of one rank's top names, longest first: each name shortened on the axis
    (numbered, so two names alike when cut stay two bars), whole in the tooltip."""
    df = df.assign(label=[f"{i}. {short_name(n)}" for i, n in zip(df["rank_in_rank"], df["name"])])
    chart(alt.Chart(df, title=title).mark_bar().encode(
        x=alt.X("total_ms:Q", title="total time (ms)"),
        y=alt.Y("label:N", title=None, sort=alt.EncodingSortField("total_ms", order="descending"),
                axis=alt.Axis(labelLimit=0, labelOverlap=False)),
        color=alt.Color("category:N", title="category"),
        tooltip=[alt.Tooltip("name:N"), alt.Tooltip("category:N"), alt.Tooltip("count:Q", title="calls"),
                 alt.Tooltip("total_ms:Q", title="total (ms)", format=",.3f"),
                 alt.Tooltip("mean_ms:Q", title="mean (ms)", format=",.4f"),
                 alt.Tooltip("max_ms:Q", title="max (ms)", format=",.4f"),
                 alt.Tooltip("share_of_steps_pct:Q", title="% of step time", format=".1f")],
    ).properties(height=24 * len(df) + 40))


ranks = list(ctx.ranks)
rank = st.selectbox("Rank", ranks, key="kernels_rank") if len(ranks) > 1 else ranks[0]


def top_section(result: object, heading: str, what: str, empty: str, chart_title: str) -> None:
    """One rank's top-N table of an analysis result: chart plus exact numbers."""
    st.subheader(heading)
    if not shown(result, what):
        return
    data = ns_to_ms(frame(result))
    data = data[data["rank"] == rank]
    if data.empty:
        st.info(f"Rank {rank} has no {empty}.")
        return
    top_chart(data, f"rank {rank}: {chart_title}")
    with st.expander("Table"):
        data_table(data)


with guarded("Top kernels"):
    top_section(ctx.analysis(top_kernels, n=TOP), f"Top {TOP} GPU kernels, copies and memsets", "Top kernels",
                "GPU work", "GPU time by name")
with guarded("Top CPU ops"):
    top_section(ctx.analysis(top_cpu_ops, n=TOP), f"Top {TOP} CPU operators (inclusive time; self and sync time "
                "in the table)", "Top CPU ops", "CPU operator events", "CPU operator time by name")

st.subheader("Launch overhead")
with guarded("Launch overhead"):
    launch = ctx.analysis(launch_overhead)
    if shown(launch, "Launch overhead"):
        launch = ns_to_ms(select(frame(launch), ctx))
        if launch.empty:
            st.info("No launch of recorded GPU work on the selected ranks.")
        else:
            st.caption("Launch-call time against the GPU time it launched: a ratio above 1 means the host takes "
                       "longer to launch than the GPU to run (launch-bound).")
            chart(alt.Chart(launch).mark_bar(size=bar_width(len(launch))).encode(
                x=alt.X("rank:O", title="rank", axis=alt.Axis(labelAngle=0, labelOverlap=True)),
                y=alt.Y("launch_to_gpu_ratio:Q", title="launch / GPU time"),
                tooltip=[alt.Tooltip("rank:O"), alt.Tooltip("launches:Q"),
                         alt.Tooltip("launch_ms:Q", title="launch calls (ms)", format=",.3f"),
                         alt.Tooltip("launched_gpu_ms:Q", title="GPU work launched (ms)", format=",.3f"),
                         alt.Tooltip("launch_to_gpu_ratio:Q", title="ratio", format=".3f"),
                         alt.Tooltip("short_launches:Q", title="GPU work shorter than its launch"),
                         alt.Tooltip("median_launch_delay_ms:Q", title="median launch delay (ms)", format=",.4f")],
            ).properties(height=240))
            data_table(launch)

st.subheader("Step-time statistics")
with guarded("Step-time statistics"):
    stats = ctx.analysis(step_stats)
    if shown(stats, "Step statistics"):
        data_table(ns_to_ms(select(frame(stats), ctx)))
