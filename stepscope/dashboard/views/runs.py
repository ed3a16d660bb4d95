"""Runs: every run in the store with its metadata, its profiled windows (the schedule and the
watch's captures with their triggers), and each rank's trace for Perfetto."""

from __future__ import annotations

import streamlit as st

from stepscope.analysis.windows import profiled_windows
from stepscope.dashboard._data import context, trace_bytes
from stepscope.dashboard._view import data_table, frame, guarded, ns_to_ms, shown

ctx = context()
st.title("Runs")
st.caption("Pick the run (and a baseline to compare against) in the sidebar; every page follows it.")

ORDER = ["run", "ranks", "events", "first_step", "last_step", "world_size", "backend", "gpu_name", "gpu_count",
         "created_at", "name", "trace_schema_version", "tags"]
with guarded("Runs"):
    runs = ctx.runs[[c for c in ORDER if c in ctx.runs.columns]].rename(columns={"name": "run name"})
    data_table(runs, keep_run=True)

st.subheader(f"Profiled windows of {ctx.run}")
st.caption("The scheduled window and every capture the watch triggered (`stepscope.profile(..., "
           "watch=True)`), with what was slow: `observed` against `reference` (the rank's rolling "
           "median, or the other ranks' median for a straggler), and `latency_steps` from the slow "
           "step to the first captured one.")
windows = ctx.analysis(profiled_windows)
if shown(windows, "Profiled windows"):
    data_table(ns_to_ms(frame(windows)))

st.subheader(f"Traces of {ctx.run}")
st.caption("Each rank's trace, to open in [Perfetto](https://ui.perfetto.dev): the file it was "
           "ingested from when it is still there unchanged, else rebuilt from the store.")
with guarded("Traces"):
    shown_ranks = ctx.ranks
    if len(ctx.ranks) > 16:  # one button per rank stops being readable; pick the rank first
        shown_ranks = (st.selectbox("Rank", ctx.ranks, key="runs_trace_rank"),)
    columns = st.columns(min(len(shown_ranks), 8))
    for i, rank in enumerate(shown_ranks):
        with columns[i % len(columns)]:
            st.download_button(
                f"rank {rank}", data=lambda rank=rank: trace_bytes(ctx, ctx.run, rank),
                file_name=f"{ctx.run}-rank{rank}.pt.trace.json.gz", mime="application/gzip",
                key=f"trace:{ctx.run}:{rank}", icon=":material/download:", on_click="ignore",
            )
