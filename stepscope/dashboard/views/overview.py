"""Overview: the verdict first, then one step across ranks over time; where each step's time goes
per rank and per step, and the step time over the run, drawn when opened (a first open computes
and sends what the page shows first: the verdict and the first chart)."""

from __future__ import annotations

import functools

import altair as alt
import pandas as pd
import pyarrow as pa
import streamlit as st

from stepscope.analysis.absent import Absent
from stepscope.analysis.breakdown import host_breakdown, rank_totals, step_breakdown, step_windows
from stepscope.store.rankstats.parts import GPU, HOST, Part
from stepscope.analysis.steps import step_times
from stepscope.analysis.critical_path import path_marks
from stepscope.analysis.timeline import (DRAWN_SLICES, TIMELINE_MAX_LANES, drawn_bars, late_marks, step_timeline,
                                         timeline_lanes, timeline_parts)
from stepscope.analysis.summary import summary_verdict
from stepscope.dashboard._critical_path import critical_path_layer
from stepscope.dashboard._data import context
from stepscope.dashboard._perfetto import MAX_INLINE_BYTES, open_button_html, rank_trace, trace_seconds
from stepscope.dashboard._filters import select
from stepscope.dashboard._view import NS_PER_MS, chart, data_table, frame, guarded, ns_to_ms, on_demand, shown
from stepscope.units import duration, percent, size

SEVERITY_ICON = {"critical": ":material/error:", "warning": ":material/warning:", "info": ":material/info:"}
# Findings listed under the verdict (the rest: in the table below them); segments drawn in the
# cross-rank timeline (past this the shortest are left out, and counted). Comments, not
# docstrings: Streamlit would print a bare string.
VERDICT_FINDINGS = 8
TIMELINE_MAX_BARS = 4000

ctx = context()
st.title(f"Overview: {ctx.run}")


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _leaves() -> dict[str, Part]:
    return {p.name: p for b in (GPU, HOST) for p in (*b.with_sub_parts(),)}


def show_verdict() -> list:
    """The run, its step basis, what bounds the step and the findings by time at stake: the
    summary's first screen, the same object (:func:`stepscope.analysis.summary.summary_verdict`,
    cached with the summary's), so the page and ``stepscope summary`` state the same figures
    against the same step."""
    v = ctx.analysis(summary_verdict)
    findings = v.get("findings") or []
    facts = v["run"]
    where = "GPU" if v.get("breakdown") == "gpu" else "host"
    head = (_n(facts.get("ranks") or 0, "rank") + " traced" + (f" of {facts['world_size']}" if facts.get("world_size") else "")
            + (f", {facts['backend']}" if facts.get("backend") else "")
            + (f", {facts['gpu_name']}" if facts.get("gpu_name") else ""))
    basis = v.get("basis")
    if basis is None:
        st.info(f"{head}. No step time: {(v.get('absent_reasons') or {}).get('step_ns', 'no steps')}",
                icon=":material/info:")
        whole = v.get("whole_trace")
        if whole:
            st.markdown(f"**Whole trace**: {whole['statement']}")
            _metrics(whole["bound_by"], "of the traced span")
            st.caption(whole["how_to_mark_steps"])
    else:
        spread = "" if basis["min_ns"] == basis["max_ns"] else \
            f"; median {duration(basis['median_ns'])}, steps {duration(basis['min_ns'])} to {duration(basis['max_ns'])}"
        st.markdown(f"**Step time {duration(basis['step_ns'])}**: the mean step over {_n(v['ranks'], 'rank')} x "
                    f"{_n(v['steps'], 'step')} ({head}{spread}), the basis of every share and per-step figure on "
                    f"this page; what bounds it ({where} time):")
        _metrics(v["bound_by"], "of the summed step windows; time per mean step")
    if not findings:
        if basis is None:
            st.info("No finding per step: the run has no steps (see the whole-trace verdict above).",
                    icon=":material/info:")
        else:
            st.success("No finding: no cause costs 1 ms per step or more.", icon=":material/check:")
    findings_list(findings)
    return findings


@st.fragment
def findings_list(findings: list) -> None:
    """Each finding's line, its rule and evidence drawn when opened (a fragment: opening one
    reruns this list, not the page)."""
    for i, f in enumerate(findings[:VERDICT_FINDINGS]):
        stake = f.get("time_at_stake_ns")
        cost = f"{duration(stake)}/step" if stake is not None else "not a time"
        share = f" ({percent(100 * f['share_of_step'])} of the mean step)" if f.get("share_of_step") is not None else ""
        on_demand(f"**{cost}{share}** · {f['message']}", f"finding:{i}", functools.partial(_evidence, f),
                  icon=SEVERITY_ICON.get(f["severity"]))
    if len(findings) > VERDICT_FINDINGS:
        rest = findings[VERDICT_FINDINGS:]
        on_demand(f"{len(rest)} more findings", "more_findings", lambda: data_table(pd.DataFrame(
            [{"rule": f["rule"], "at stake per step": f.get("time_at_stake_ns"), "message": f["message"]}
             for f in rest])))


def _evidence(finding: dict) -> None:
    """A finding's rule, severity, ranks and evidence."""
    ranks = ", ".join(map(str, finding["ranks"])) or "n/a"
    st.caption(f"rule `{finding['rule']}` ({finding['severity']}), ranks {ranks}")
    st.json(finding["evidence"])


def _metrics(parts: list, what: str) -> None:
    """One metric per part: its time, its share in the label (never clipped: the label wraps)."""
    cols = st.columns(max(1, len(parts)))
    for col, b in zip(cols, parts):
        col.metric(b["label"], duration(b["ns"]), delta=percent(100 * b["share"]), delta_color="off",
                   help=f"{b['label']}: {percent(100 * b['share'])} {what}")


def _default_step(findings: list, steps: list[int]) -> int:
    """The step the worst late-rank finding names, else the first profiled step."""
    for f in findings:
        if f["rule"] == "comm.late_rank" and f["evidence"].get("step") in steps:
            return int(f["evidence"]["step"])
    return steps[0]


def show_timeline(findings: list) -> None:
    """One step across ranks: a lane per rank, its parts over time, the late arrivals marked."""
    windows = ctx.analysis(step_windows)
    steps = sorted(set(frame(windows)["step"])) if not isinstance(windows, Absent) and windows.num_rows else []
    if not steps:
        st.info("No profiled step (ProfilerStep#N) in this run: no timeline.", icon=":material/info:")
        return
    default = _default_step(findings, steps)
    step = st.selectbox("Step", steps, index=steps.index(default), key="timeline_step")
    first = _lanes_first(int(step)) if len(ctx.ranks) > TIMELINE_MAX_LANES else []
    wanted = timeline_lanes(ctx.ranks, first, TIMELINE_MAX_LANES)
    drawn = _timeline_drawn(ctx.root, ctx.run, ctx.fingerprint(ctx.run), int(step), tuple(wanted))
    if not shown(drawn, "Step timeline"):
        return
    data, origin, order, cut = drawn
    if data.empty:
        st.info("No segment of the selected ranks in this step.")
        return
    lanes = sorted(data["rank"].unique())
    color = alt.Color("label:N", title="part", sort=[p.label for p in order], legend=alt.Legend(labelLimit=0, orient="bottom", columns=3),
                      scale=alt.Scale(domain=[p.label for p in order], range=[p.color for p in order]))
    # ascending, as `lanes` is: a list of 1,024 ranks would be schema-checked item by item per layer
    y = alt.Y("rank:O", title="rank", sort="ascending", axis=alt.Axis(labelOverlap=len(lanes) > 32))
    layers = [alt.Chart(data).mark_bar(height=max(6, min(28, 360 // max(len(lanes), 1)))).encode(
        x=alt.X("start_ms:Q", title="ms since the step's first start (clocks aligned)"), x2="end_ms:Q", y=y,
        color=color,
        tooltip=[alt.Tooltip("rank:O"), alt.Tooltip("label:N", title="part"),
                 alt.Tooltip("start_ms:Q", title="from (ms)", format=",.3f"),
                 alt.Tooltip("end_ms:Q", title="to (ms)", format=",.3f"),
                 alt.Tooltip("dur_ms:Q", title="duration (ms)", format=",.3f"),
                 alt.Tooltip("part_ms:Q", title="of which this part (ms)", format=",.3f"),
                 alt.Tooltip("segments:Q", title="segments begun in it")])]
    marks = frame(ctx.analysis(late_marks, step=int(step)))
    marks = marks[marks["rank"].isin(lanes)] if len(marks) else marks
    if len(marks):
        marks = marks.assign(t_ms=(marks["t_ns"] - origin) / NS_PER_MS, waited_ms=marks["others_wait_ns"] / NS_PER_MS)
        layers.append(alt.Chart(marks).mark_point(shape="triangle-down", size=140, filled=True, color="black").encode(
            x="t_ms:Q", y=y,
            tooltip=[alt.Tooltip("rank:O", title="late rank"), alt.Tooltip("collective:N"),
                     alt.Tooltip("t_ms:Q", title="arrived at (ms)", format=",.3f"),
                     alt.Tooltip("waited_ms:Q", title="the others waited (ms, summed)", format=",.3f")]))
    path = critical_path_layer(ctx, int(step), origin, y, lanes)
    if path is not None:
        layers.append(path)
    chart(alt.layer(*layers).properties(height=max(160, min(720, 40 * len(lanes)))))
    if len(wanted) < len(ctx.ranks):
        st.caption(f"{len(wanted)} of the {len(ctx.ranks):,} ranks chosen have a lane: first those arriving late in "
                   "this step and those on its critical path, then ranks evenly spaced over the rest. Choose up to "
                   f"{TIMELINE_MAX_LANES} ranks in the sidebar to draw those.")
    st.caption("Black triangles: a rank arriving late at a collective the others waited in. "
               + ("Thin black bars: the step's critical path, rank by rank. " if path is not None else "")
               + (f"{cut:,} bars shorter than the {TIMELINE_MAX_BARS:,} drawn are left out. " if cut else "")
               + "Each bar is one stretch of one part (the step breakdown's rules, over time), drawn at "
               f"1/{DRAWN_SLICES:,} of the step: where parts alternate faster, a bar shows the part that held "
               "most of that time, and its tooltip how much of the bar that part holds.")
    on_demand("Open a rank's trace in Perfetto", "perfetto", functools.partial(_perfetto_picker, lanes, int(step)),
              icon=":material/open_in_new:")


def _perfetto_picker(lanes: list[int], step: int) -> None:
    """The rank to open and its button. On demand: the button carries the rank's whole trace
    (inline, up to ``MAX_INLINE_BYTES``: 4 MB of base64 for df_index_resolver), which every
    render of the page would otherwise build and send."""
    left, right = st.columns([1, 3])
    rank = int(left.selectbox("Rank", lanes, key="timeline_rank"))
    with right:
        open_in_perfetto(rank, step)


def _lanes_first(step: int) -> list[int]:
    """The ranks the timeline draws before any other when it cannot draw them all: those that
    arrived late in ``step`` (the others' summed wait, largest first), then the ranks its
    critical path runs on (longest there first)."""
    late = frame(ctx.analysis(late_marks, step=step))
    path = frame(ctx.analysis(path_marks, step=step))
    first = []
    if len(late):
        first += late.groupby("rank")["others_wait_ns"].sum().sort_values(ascending=False, kind="stable").index.tolist()
    if len(path):
        on_path = (path["t1_ns"] - path["t0_ns"]).groupby(path["rank"]).sum()
        first += on_path.sort_values(ascending=False, kind="stable").index.tolist()
    return first


@st.cache_data(show_spinner=False, max_entries=16)
def _timeline_drawn(root: str, run: str, fingerprint: str, step: int, ranks: tuple[int, ...]):
    """What the step timeline draws of ``step`` for ``ranks``, once per (store, run, its sources,
    step, ranks): the step's bars at the drawing resolution (:func:`drawn_bars`), the
    :data:`TIMELINE_MAX_BARS` longest, with their labels and times in ms since the step's first
    start, that start, the parts present (in the catalogue's order) and how many bars were left
    out; the analysis's :class:`Absent` as it is. Kept small: a step of
    1,024 ranks has a million segments, which a new session should not copy and convert again;
    and only the columns the chart encodes, which the browser decodes and Vega copies per bar."""
    # the whole run's frame (cached on disk) when every rank has a lane; else only the lanes'
    every = set(ranks) == set(ctx.all_ranks)
    segments = ctx.analysis(step_timeline, step=step, **({} if every else {"ranks": ranks}))
    if isinstance(segments, Absent):
        return segments
    data = frame(segments)
    data = data[data["rank"].isin(ranks)]
    if data.empty:
        return data, 0, [], 0
    origin = int(data["t0_ns"].min())
    leaves = _leaves()
    breakdown = GPU if data["breakdown"].iloc[0] == "gpu" else HOST
    present = set(data["part"].unique())
    order = [p for p in timeline_parts(breakdown) if p.name in present]
    bars = frame(drawn_bars(pa.Table.from_pandas(data[["rank", "part", "t0_ns", "t1_ns"]], preserve_index=False)))
    cut = 0
    if len(bars) > TIMELINE_MAX_BARS:
        keep = (bars["t1_ns"] - bars["t0_ns"]).nlargest(TIMELINE_MAX_BARS).index
        cut = len(bars) - len(keep)
        bars = bars.loc[keep]
    labels = {name: leaf.label for name, leaf in leaves.items()}
    data = pd.DataFrame({"rank": bars["rank"], "label": bars["part"].map(labels),
                         "start_ms": (bars["t0_ns"] - origin) / NS_PER_MS, "end_ms": (bars["t1_ns"] - origin) / NS_PER_MS,
                         "dur_ms": (bars["t1_ns"] - bars["t0_ns"]) / NS_PER_MS, "part_ms": bars["part_ns"] / NS_PER_MS,
                         "segments": bars["segments"]})
    return data, origin, order, cut


@st.cache_data(show_spinner="Preparing the rank's trace...", max_entries=4)
def _rank_trace(root: str, run: str, fingerprint: str, rank: int) -> tuple[bytes, int]:
    """The rank's trace for Perfetto, once per (store, run, its sources, rank)."""
    return rank_trace(ctx.store, run, rank)


def open_in_perfetto(rank: int, step: int) -> None:
    """One click: the rank's trace opens in ui.perfetto.dev at ``step`` (:mod:`stepscope.dashboard._perfetto`).
    A trace too big to hand to the page inline is a download instead."""
    data, base = _rank_trace(ctx.root, ctx.run, ctx.fingerprint(ctx.run), rank)
    name = f"{ctx.run}-rank{rank}.pt.trace.json.gz"
    if len(data) > MAX_INLINE_BYTES:
        st.download_button(f"rank {rank} trace for Perfetto ({size(len(data))}: too big to open in one click)",
                           data=data, file_name=name, mime="application/gzip", key=f"timeline_trace:{ctx.run}:{rank}",
                           icon=":material/download:", on_click="ignore")
        return
    windows = frame(ctx.analysis(step_windows))
    row = windows[(windows["rank"] == rank) & (windows["step"] == step)]
    start = end = None
    if len(row):
        start, end = (trace_seconds(int(row[c].iloc[0]), base) for c in ("start_ns", "end_ns"))
    st.iframe(open_button_html(data, f"{ctx.run} rank {rank} step {step}", name, start, end), height=48)
    st.caption(f"Opens a new tab at step {step} of rank {rank}, in that rank's own clock (allow pop-ups for this page).")


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
    long = long[["rank", "step", "part", "ms", "step_ms", "order"]]  # what the charts encode: no more is sent
    color = alt.Color("part:N", title="part", sort=list(labels.values()), legend=alt.Legend(labelLimit=0, orient="bottom", columns=3),
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


@st.fragment
def breakdown_section(analysis, breakdown, what: str, caption: str | None = None) -> None:
    """One breakdown's charts and its table (drawn when opened), for the selected ranks and steps
    (a fragment: choosing a rank or a step, or opening the table, reruns this section alone)."""
    with guarded(what):
        steps = ctx.analysis(analysis)
        if not shown(steps, what):
            return
        steps = select(frame(steps), ctx)
        if steps.empty:
            st.info("No steps of the selected ranks fall in the step range.")
            return
        if caption:
            st.caption(caption)
        breakdown_charts(steps, tuple(breakdown.leaves()), breakdown.name)
        on_demand(f"{what} table (ms)", f"{breakdown.name}_table", lambda: data_table(ns_to_ms(steps)))


def gpu_section() -> None:
    """The GPU breakdown's charts and table, and the whole-trace GPU totals."""
    breakdown_section(step_breakdown, GPU, "Step breakdown")
    gpu_totals()


def host_section() -> None:
    """The host breakdown's charts and table, with the order in which its parts claim an instant."""
    *claiming, rest = HOST.parts
    breakdown_section(host_breakdown, HOST, "Host breakdown",
                      "Over all of the rank's threads; an instant goes to the first of these active, in this order: "
                      f"{', '.join(p.label for p in claiming)}; {rest.label}: none of them.")


@st.fragment
def gpu_totals() -> None:
    """HTA-style whole-trace totals per rank, drawn when opened (ranks without GPU events: the
    reason instead)."""
    with guarded("GPU totals"):
        totals = ctx.analysis(rank_totals)
        if not shown(totals, "GPU totals"):
            return
        totals = ns_to_ms(select(frame(totals), ctx))
        with_gpu = totals[totals["absent_reason"].isna()]
        if with_gpu.empty:
            for reason in sorted(set(totals["absent_reason"].dropna())):
                st.info(f"GPU totals: {reason}", icon=":material/info:")
        else:
            on_demand("Whole-trace GPU totals per rank (HTA definitions)", "gpu_totals_table",
                      lambda: data_table(with_gpu))


@st.fragment
def step_time_over_run() -> None:
    """Every step the collector timed (step_times) when the run has them, else the profiled
    steps' windows; the table drawn when opened."""
    with guarded("Step time over the run"):
        _step_time_chart()


def _step_time_chart() -> None:
    """The step-time chart and its table."""
    times = ctx.analysis(step_times)
    if isinstance(times, Absent):
        windows = ctx.analysis(step_windows)
        if not shown(windows, "Step times"):
            return
        st.caption(f"Profiled steps only ({times.reason}; the collector's step timer records every step).")
        times = ns_to_ms(select(frame(windows), ctx)).rename(columns={"dur_ms": "wall_ms"})
        times["profiled"] = True
    else:
        times = ns_to_ms(select(frame(times), ctx, step=None))
    if times.empty:
        return
    chart(alt.Chart(times[["rank", "step", "wall_ms", "profiled"]]).mark_line(point=True).encode(  # what it encodes
        x=alt.X("step:Q", title="step", axis=alt.Axis(format="d", tickMinStep=1)),
        y=alt.Y("wall_ms:Q", title="step time (ms)"),
        # Past 16 ranks a legend is noise: one colour, one line per rank, the rank in the tooltip.
        color=alt.Color("rank:N", title="rank") if times["rank"].nunique() <= 16 else alt.value("#4C78A8"),
        detail="rank:N",
        tooltip=[alt.Tooltip("rank:O"), alt.Tooltip("step:Q"),
                 alt.Tooltip("wall_ms:Q", title="step (ms)", format=",.3f"), alt.Tooltip("profiled:N")],
    ).properties(height=280))
    on_demand("Step times table (ms)", "step_times_table", lambda: data_table(times))


st.subheader("Verdict")
found: list = []
with guarded("Verdict"), st.spinner("Evaluating the findings rules..."):
    found = show_verdict()

st.subheader("One step across ranks")
with guarded("Step timeline"):
    show_timeline(found)

st.subheader("Where the time goes")
on_demand("Where each step's GPU time goes", "gpu_breakdown", gpu_section, icon=":material/bar_chart:")
on_demand("Where each step's host (CPU) time goes", "host_breakdown", host_section, icon=":material/bar_chart:")
on_demand("Step time over the whole run", "step_time_over_run", step_time_over_run, icon=":material/show_chart:")
