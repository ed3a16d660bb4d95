"""The critical path drawn over the Overview's cross-rank timeline (issue 21).

A thin black bar over each lane where the step's critical path runs on that rank
(:func:`stepscope.analysis.critical_path.path_marks`), in the timeline's aligned time, with
what the piece is in its tooltip. A helper of its own so the Overview gains one layer, not a
block of chart code.
"""

from __future__ import annotations

from typing import Any

import altair as alt

from stepscope.analysis.critical_path import path_marks
from stepscope.dashboard._view import NS_PER_MS, frame


def critical_path_layer(ctx: Any, step: int, origin: int, y: Any, lanes: list[int]) -> alt.Chart | None:
    """The path's layer for ``step`` (None when the step has no path on the lanes shown)."""
    marks = frame(ctx.analysis(path_marks, step=int(step)))
    if not len(marks):
        return None
    marks = marks[marks["rank"].isin(lanes)]
    if not len(marks):
        return None
    marks = marks.assign(start_ms=(marks["t0_ns"] - origin) / NS_PER_MS, end_ms=(marks["t1_ns"] - origin) / NS_PER_MS,
                         dur_ms=(marks["t1_ns"] - marks["t0_ns"]) / NS_PER_MS)
    return alt.Chart(marks).mark_bar(height=3, color="black").encode(
        x="start_ms:Q", x2="end_ms:Q", y=y,
        tooltip=[alt.Tooltip("rank:O", title="critical path on rank"), alt.Tooltip("what:N", title="piece"),
                 alt.Tooltip("part:N", title="mostly"), alt.Tooltip("dur_ms:Q", title="duration (ms)", format=",.3f")])
