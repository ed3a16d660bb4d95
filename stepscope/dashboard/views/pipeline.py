"""Pipeline & FLOPs: stages, microbatch spans and bubbles against the schedule's ideal; FLOPs and MFU."""

from __future__ import annotations

import altair as alt
import streamlit as st

from stepscope.analysis.flops import flops_by_family_section, mfu_section
from stepscope.analysis.pipeline import PipelineResult, pipeline_section
from stepscope.dashboard._data import context
from stepscope.dashboard._filters import select
from stepscope.dashboard._view import chart, data_table, frame, ns_to_ms, shown

PARTS = ["busy", "fill", "wait", "drain"]
PART_COLORS = ["#4C78A8", "#F58518", "#E45756", "#BAB0AC"]
KIND_COLORS = {"forward": "#4C78A8", "backward": "#72B7B2", "weight": "#B279A2"}

ctx = context()
st.title(f"Pipeline & FLOPs: {ctx.run}")

st.subheader("Pipeline parallelism")
result = ctx.section(pipeline_section)
if shown(result, "Pipeline"):
    assert isinstance(result, PipelineResult)
    columns = st.columns(5)
    columns[0].metric("schedule", result.schedule)
    columns[1].metric("stages", f"{result.stages_count}" + (f" x {result.stages_per_rank}" if result.stages_per_rank > 1 else ""))
    columns[2].metric("microbatches", "-" if not isinstance(result.microbatches, int) else result.microbatches)
    columns[3].metric("ideal bubble", "-" if not isinstance(result.ideal_fraction, float) else f"{result.ideal_fraction:.1%}")
    columns[4].metric("measured bubble", "-" if result.measured_fraction is None else f"{result.measured_fraction:.1%}")
    st.caption("Pipelines (ranks in stage order): " + "; ".join(" -> ".join(map(str, p.ranks)) for p in result.pipelines)
               + ". Ideal: (p - 1) / (v m + p - 1). Bubble: step time not covered by work, split into fill "
                 "(before the first forward), wait (between microbatches) and drain (after the last backward).")
    for finding in ctx.findings():
        if finding["rule"] == "pipeline.bubble":
            st.warning(finding["message"], icon=":material/warning:")

    stages = ns_to_ms(select(frame(result.stage_table()), ctx))
    spans = ns_to_ms(select(frame(result.span_table()), ctx))
    steps = sorted(stages["step"].unique())
    if not steps:
        st.info("No pipeline step among the selected ranks and steps.")
    else:
        step = st.selectbox("Step", steps, key="pipeline_step") if len(steps) > 1 else steps[0]
        shown_stages = stages[stages["step"] == step]
        parts = shown_stages.melt(id_vars=["rank", "stage"], value_vars=[f"{p}_ms" for p in PARTS],
                                  var_name="part", value_name="ms")
        parts["part"] = parts["part"].str.removesuffix("_ms")
        chart(alt.Chart(parts, title=f"step {step}: where each stage's time goes").mark_bar().encode(
            x=alt.X("ms:Q", title="ms", stack="zero"),
            y=alt.Y("stage:O", title="stage"),
            color=alt.Color("part:N", scale=alt.Scale(domain=PARTS, range=PART_COLORS), sort=PARTS),
            order=alt.Order("part_order:Q"),
            tooltip=[alt.Tooltip("rank:O"), alt.Tooltip("stage:O"), alt.Tooltip("part:N"),
                     alt.Tooltip("ms:Q", format=",.3f")],
        ).transform_calculate(part_order=f"indexof({PARTS}, datum.part)").properties(height=50 * len(shown_stages) + 80))
        st.caption("Busy: covered by work (microbatch spans and other work, gaps under 1 ms included).")
        timeline = spans[spans["step"] == step].copy()
        if not timeline.empty:
            timeline["offset_end_ms"] = timeline["offset_ms"] + (timeline["end_ms"] - timeline["start_ms"])
            timeline["label"] = timeline["kind"].str[0].str.upper() + timeline["microbatch"].astype(str)
            bars = alt.Chart(timeline, title=f"step {step}: microbatch spans per stage (ms from the step's start)").encode(
                x=alt.X("offset_ms:Q", title="ms from the step's start"), x2="offset_end_ms:Q",
                y=alt.Y("rank:O", title="rank (stage order)", sort=[r for p in result.pipelines for r in p.ranks]),
                tooltip=[alt.Tooltip("rank:O"), alt.Tooltip("stage:O"), alt.Tooltip("kind:N"),
                         alt.Tooltip("microbatch:O"), alt.Tooltip("offset_ms:Q", title="start (ms)", format=",.3f"),
                         alt.Tooltip("busy_ms:Q", title="busy (ms)", format=",.3f")])
            chart((bars.mark_bar(opacity=0.85, cornerRadius=2).encode(
                color=alt.Color("kind:N", scale=alt.Scale(domain=list(KIND_COLORS), range=list(KIND_COLORS.values()))))
                + bars.mark_text(color="white", fontSize=10, dx=2, align="left").encode(text="label:N"))
                .properties(height=70 * timeline["rank"].nunique() + 80))
        data_table(stages, "Per stage and step (bubble_fraction = bubble / step)")

st.subheader("FLOPs and MFU")
mfu = ctx.section(mfu_section)
if shown(mfu, "MFU"):
    per_step = ns_to_ms(select(frame(mfu), ctx))
    st.caption("FLOPs of the matrix products, convolutions and attention ops that ran in each step (each product "
               "once); MFU = time those products would take at the device's dense peak for their dtype / step time.")
    measure = "mfu" if per_step["mfu"].notna().any() else "achieved_tflops"
    chart(alt.Chart(per_step).mark_bar().encode(
        x=alt.X("step:O", title="step"), y=alt.Y(f"{measure}:Q", title=measure.replace("_", " ")),
        color=alt.Color("rank:N"), xOffset="rank:N",
        tooltip=[alt.Tooltip("rank:O"), alt.Tooltip("step:O"), alt.Tooltip("flops:Q", format=",d"),
                 alt.Tooltip("achieved_tflops:Q", format=",.3f"), alt.Tooltip("mfu:Q", format=".2%"),
                 alt.Tooltip("dtype:N"), alt.Tooltip("peak_tflops:Q", format=",.1f")],
    ).properties(height=260))
    data_table(per_step)
    families = ctx.section(flops_by_family_section)
    if shown(families, "FLOPs by op family"):
        data_table(ns_to_ms(select(frame(families), ctx, step=None)), "Per op family: FLOPs over the time of the "
                   "kernels the family's ops launched (their own CPU time on a CPU-only rank)")
    for finding in ctx.findings():
        if finding["rule"] == "mfu.low":
            st.warning(finding["message"], icon=":material/warning:")
