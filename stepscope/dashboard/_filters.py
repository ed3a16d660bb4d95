"""Run, baseline, rank and step-range filters: one sidebar shared by every page.

The widgets live in ``st.session_state`` (so they survive page switches) and are mirrored into
the URL's query parameters, so a link opens the same view. Query parameters are only ever
*selections among what the store holds*: a run id must be in the ``runs`` table, ranks in the
run's ranks, steps in its step range; anything else is ignored. The store path is never read
from the URL.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from stepscope.dashboard._data import Context

NO_BASELINE = "(none)"


def _parse_ints(text: str | None) -> list[int]:
    """``"0,3,7"`` -> ``[0, 3, 7]``; anything that is not a list of integers -> ``[]``."""
    if not text:
        return []
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        return []


def _step_range(text: str | None, first: int, last: int) -> tuple[int, int]:
    """``"3-5"`` clipped to ``[first, last]``; the whole range when it is not a range inside."""
    wanted = _parse_ints((text or "").replace("-", ","))
    if len(wanted) == 2:
        lo, hi = max(first, wanted[0]), min(last, wanted[1])
        if lo <= hi:
            return lo, hi
    return first, last


def _seed(key: str, value: Any) -> None:
    """Give a widget its first value (from the URL) without fighting later user changes."""
    if key not in st.session_state:
        st.session_state[key] = value


def _valid_run(runs: list[str], candidate: str | None, default: str | None) -> str | None:
    return candidate if candidate in runs else default


def sidebar(root: str, runs_df: Any) -> Context:
    """Draw the filters and return the page context. ``runs_df`` is ``_data.runs_table``."""
    params = st.query_params
    runs = runs_df["run"].tolist()

    # A run chosen earlier may be gone (re-created store); fall back quietly.
    if st.session_state.get("run") not in runs:
        st.session_state.pop("run", None)
    _seed("run", _valid_run(runs, params.get("run"), runs[-1]))
    st.sidebar.selectbox("Run", runs, key="run", help="Every page shows this run.")
    run = st.session_state["run"]

    others = [NO_BASELINE, *[r for r in runs if r != run]]
    if st.session_state.get("baseline") not in others:
        st.session_state.pop("baseline", None)
    _seed("baseline", _valid_run(others, params.get("baseline"), NO_BASELINE))
    st.sidebar.selectbox("Baseline", others, key="baseline", help="Compared against the run on the Compare page.")
    baseline = st.session_state["baseline"]

    row = runs_df.loc[runs_df["run"] == run].iloc[0]
    all_ranks = tuple(int(r) for r in row["rank_list"])
    rank_key = f"ranks:{run}"
    _seed(rank_key, [r for r in _parse_ints(params.get("ranks")) if r in all_ranks])
    chosen = st.sidebar.multiselect("Ranks", all_ranks, key=rank_key, placeholder="all ranks",
                                    help="Empty: every rank of the run.")
    ranks = tuple(sorted(chosen)) if chosen else all_ranks

    steps: tuple[int, int] | None = None
    first, last = row["first_step"], row["last_step"]
    if not (pd.isna(first) or pd.isna(last)):
        first, last = int(first), int(last)
        step_key = f"steps:{run}"
        _seed(step_key, _step_range(params.get("steps"), first, last))
        if first < last:
            steps = st.sidebar.slider("Steps", first, last, key=step_key, help="ProfilerStep numbers to show.")
        else:
            steps = (first, last)
            st.sidebar.caption(f"Step {first} (the only profiled step)")
    else:
        st.sidebar.caption("No ProfilerStep annotations: step filters do not apply.")

    st.query_params.from_dict({
        "run": run,
        **({"baseline": baseline} if baseline != NO_BASELINE else {}),
        **({"ranks": ",".join(map(str, ranks))} if chosen else {}),
        **({"steps": f"{steps[0]}-{steps[1]}"} if steps and steps != (first, last) else {}),
    })
    return Context(root=root, runs=runs_df, run=run, baseline=None if baseline == NO_BASELINE else baseline,
                   ranks=ranks, all_ranks=all_ranks, steps=steps)


def select(frame: Any, ctx: Context, *, rank: str | None = "rank", step: str | None = "step") -> Any:
    """Rows of an analysis frame inside the rank and step filters (columns absent: no filter).

    Selection only: the values in the rows are the analysis layer's, untouched.
    """
    if frame is None:
        return frame
    mask = None
    if rank and rank in frame.columns:
        mask = frame[rank].isin(ctx.ranks)
    if step and ctx.steps and step in frame.columns:
        in_range = frame[step].between(*ctx.steps) | frame[step].isna()
        mask = in_range if mask is None else mask & in_range
    return frame if mask is None else frame[mask]
