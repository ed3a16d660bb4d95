"""Overview: what each step's time went to, per rank and per step, and the run's findings."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from stepscope.analysis.absent import Absent
from stepscope.analysis.breakdown import host_breakdown, rank_totals, step_breakdown, step_windows
from stepscope.analysis.parts import GPU, HOST, Part
from stepscope.analysis.steps import step_times
from stepscope.dashboard._data import context
from stepscope.dashboard._filters import select
from stepscope.dashboard._view import NS_PER_MS, chart, data_table, frame, ns_to_ms, shown

SEVERITY_ICON = {"critical": ":material/error:", "warning": ":material/warning:", "info": ":material/info:"}

ctx = context()
st.title(f"Overview: {ctx.run}")



def breakdown_charts(steps, parts: tuple[Part, ...], key: str) -> None:
    """Stacked bars of one breakdown (its disjoint parts, in the catalogue's labels, colours and
    order): a chosen rank's every step, and a chosen step's every rank.

    Each bar segment is one row value of the analysis table (no aggregation here).
    """
    labels = {p.column: p.label for p in parts}
    long = steps.melt(id_vars=["rank", "step", "dur_ns"], value_vars=list(labels), var_name="part_col",
                      value_name="ns")
    long["part"] = long["part_col"].map(labels)
    long["ms"] = long["ns"] / NS_PER_MS
    long["step_ms"] = long["dur_ns"] / NS_PER_MS
    long["order"] = long["part_col"].map({c: i for i, c in enumerate(labels)})
    color = alt.Color("part:N", title="part", sort=list(labels.values()), legend=alt.Legend(labelLimit=260),
                      scale=alt.Scale(domain=list(labels.values()), range=[p.color for p in parts]))
    order = alt.Order("order:Q")
    tooltip = [alt.Tooltip("rank:O"), alt.Tooltip("step:O"), alt.Tooltip("part:N"),
               alt.Tooltip("ms:Q", title="time (ms)", format=",.3f"),
               alt.Tooltip("step_ms:Q", title="step (ms)", format=",.3f")]
    left, right = st.columns(2)
    with left:
        rank = st.selectbox("Rank, every step", sorted(steps["rank"].unique()), key=f"{key}_rank")
        data = long[long["rank"] == rank]
        chart(alt.Chart(data, title=f"rank {rank}: every step").mark_bar().encode(
            x=alt.X("step:O", title="step", axis=alt.Axis(labelAngle=0)),
            y=alt.Y("ms:Q", title="time (ms)", stack="zero"), color=color, order=order, tooltip=tooltip,
        ).properties(height=320))
    with right:
        step = st.selectbox("Step, every rank", sorted(steps["step"].unique()), key=f"{key}_step")
        data = long[long["step"] == step]
        chart(alt.Chart(data, title=f"step {step}: every rank").mark_bar().encode(
            x=alt.X("rank:O", title="rank", axis=alt.Axis(labelAngle=0, labelOverlap=True)),
            y=alt.Y("ms:Q", title="time (ms)", stack="zero"), color=color, order=order, tooltip=tooltip,
        ).properties(height=320))
        if data["rank"].nunique() > 64:
            st.caption(f"{data['rank'].nunique()} ranks: hover a bar for its rank.")


# Headline: HTA-style whole-trace totals per rank (ranks without GPU events: the reason instead).
totals = ctx.analysis(rank_totals)
if shown(totals, "GPU totals"):
    totals = ns_to_ms(select(frame(totals), ctx))
    with_gpu = totals[totals["absent_reason"].isna()]
    if len(with_gpu) == 1:
        row = with_gpu.iloc[0]
        cols = st.columns(5)
        cols[0].metric("GPU span (ms)", f"{row['gpu_span_ms']:,.2f}")
        cols[1].metric("GPU busy (ms)", f"{row['gpu_busy_ms']:,.2f}")
        cols[2].metric("compute (ms)", f"{row['compute_ms']:,.2f}")
        cols[3].metric("GPU idle (ms)", f"{row['gpu_idle_ms']:,.2f}")
        overlap = row["comm_comp_overlap_pct"]
        cols[4].metric("comm. hidden (%)", "n/a" if overlap != overlap else f"{overlap:.1f}",
                       help=row["overlap_absent_reason"] or "communication time under compute kernels")
    if with_gpu.empty:
        for reason in sorted(set(totals["absent_reason"].dropna())):
            st.info(f"GPU totals: {reason}", icon=":material/info:")
    else:
        with st.expander("Whole-trace GPU totals per rank (HTA definitions)", expanded=1 < len(with_gpu) <= 8):
            data_table(with_gpu)

# Findings: their place is here, but they need every section of the run, the slowest thing to
# compute on a first open; the charts below are drawn first and the findings fill this slot last.
findings_slot = st.container()

st.subheader("Where each step's GPU time goes")
steps = ctx.analysis(step_breakdown)
if shown(steps, "Step breakdown"):
    steps = select(frame(steps), ctx)
    if steps.empty:
        st.info("No steps of the selected ranks fall in the step range.")
    else:
        breakdown_charts(steps, GPU.parts, "gpu")
        with st.expander("Step breakdown table (ms)"):
            data_table(ns_to_ms(steps))

st.subheader("Where each step's host (CPU) time goes")
host = ctx.analysis(host_breakdown)
if shown(host, "Host breakdown"):
    host = select(frame(host), ctx)
    if host.empty:
        st.info("No steps of the selected ranks fall in the step range.")
    else:
        *claiming, rest = HOST.parts
        st.caption("Over all of the rank's threads; an instant goes to the first of these active, in this order: "
                   f"{', '.join(p.label for p in claiming)}; {rest.label}: none of them.")
        breakdown_charts(host, HOST.parts, "host")
        with st.expander("Host breakdown table (ms)"):
            data_table(ns_to_ms(host))

# Step time over the whole run: every step the collector timed (step_times) when the run has
# them, else the profiled steps' windows.
st.subheader("Step time over the whole run")
times = ctx.analysis(step_times)
if isinstance(times, Absent):
    windows = ctx.analysis(step_windows)
    if shown(windows, "Step times"):
        st.caption(f"Profiled steps only ({times.reason}; the collector's step timer records every step).")
        times = ns_to_ms(select(frame(windows), ctx)).rename(columns={"dur_ms": "wall_ms"})
        times["profiled"] = True
else:
    times = ns_to_ms(select(frame(times), ctx, step=None))
if not isinstance(times, Absent) and not times.empty:
    chart(alt.Chart(times).mark_line(point=True).encode(
        x=alt.X("step:Q", title="step", axis=alt.Axis(format="d", tickMinStep=1)),
        y=alt.Y("wall_ms:Q", title="step time (ms)"),
        # Past 16 ranks a legend is noise: one colour, one line per rank, the rank in the tooltip.
        color=alt.Color("rank:N", title="rank") if times["rank"].nunique() <= 16 else alt.value("#4C78A8"),
        detail="rank:N",
        tooltip=[alt.Tooltip("rank:O"), alt.Tooltip("step:Q"), alt.Tooltip("wall_ms:Q", title="step (ms)", format=",.3f"),
                 alt.Tooltip("profiled:N")],
    ).properties(height=280))
    with st.expander("Step times table (ms)"):
        data_table(times)

# Findings, into their slot at the top: one line per rule (a rule firing on 256 ranks is one
# story), the first finding's message as its title and every finding's evidence in its table.
findings_slot.subheader("Findings")
with findings_slot, st.spinner("Evaluating the findings rules..."):
    findings = [f for f in ctx.findings() if f.evidence.get("rank") in (None, *ctx.ranks)]
if not findings:
    findings_slot.success("No rule fired for the selected ranks.", icon=":material/check:")
by_rule: dict[str, list] = {}
for f in findings:
    by_rule.setdefault(f.rule, []).append(f)
for rule_id, group in sorted(by_rule.items(), key=lambda item: item[1][0].severity.rank):  # worst first
    first = group[0]
    more = f"  (and {len(group) - 1} more like it)" if len(group) > 1 else ""
    with findings_slot.expander(f"{first.message}{more}", icon=SEVERITY_ICON.get(first.severity.value)):
        st.caption(f"rule `{rule_id}` ({first.severity.value})")
        if len(group) == 1:
            st.json(dict(first.evidence))
        else:
            data_table(pd.DataFrame([{"message": f.message, **f.evidence} for f in group]))
