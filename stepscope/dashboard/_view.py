"""Rendering helpers shared by the pages: absence notes, unit columns, tables, Altair defaults.

Unit conversion (ns -> ms, bytes -> GiB) is presentation: the values are the analysis layer's,
divided by a constant so that axes read in ms, GB/s and GiB. The constants are
:mod:`stepscope.units`' (the one place units are defined), re-exported for the pages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import altair as alt
import pyarrow as pa
import streamlit as st

from stepscope.analysis.absent import Absent
from stepscope.units import GIB, NS_PER_MS, unit_for_key

__all__ = ["GIB", "NS_PER_MS", "bar_width", "chart", "data_table", "frame", "guarded", "ns_to_ms", "on_demand",
           "shown", "with_units"]


@contextmanager
def guarded(section: str) -> Iterator[None]:
    """One section of a page: if it raises, one line names the section and the error and the rest
    of the page still renders (no traceback on the page). Streamlit's own control flow
    (``st.stop``, reruns) passes through: those are not ``Exception`` s."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - the point: a section's failure stays in its section
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        st.error(f"{section}: {type(exc).__name__}: {first}", icon=":material/error:")


def on_demand(label: str, key: str, draw: Callable[[], None], *, icon: str | None = None) -> None:
    """A collapsed expander whose content is computed and sent only while it is open (Streamlit's
    lazy expander: opening it reruns the fragment it is in, else the page). A table or a finding's
    evidence nobody opened costs neither the server its frame nor the browser a data grid, so a
    page's first render is what it shows first (issue 20). ``key`` holds the open state in
    ``st.session_state`` (unique on the page)."""
    with st.expander(label, key=key, icon=icon, on_change="rerun") as box:
        if box.open:
            draw()


def shown(value: Any, what: str = "") -> bool:
    """True when ``value`` can be drawn; otherwise say why (an :class:`Absent`) and return False."""
    if isinstance(value, Absent):
        st.info(f"{what + ': ' if what else ''}{value.reason}", icon=":material/info:")
        return False
    return True


def frame(value: Any) -> Any:
    """An analysis table as pandas (Arrow tables convert once, here)."""
    if isinstance(value, pa.Table):
        return value.to_pandas()
    return value


def with_units(df: Any, columns: dict[str, tuple[str, float]]) -> Any:
    """A copy of ``df`` with ``new = df[old] / divisor`` for each ``new: (old, divisor)``."""
    out = df.copy()
    for new, (old, divisor) in columns.items():
        if old in out.columns:
            out[new] = out[old] / divisor
    return out


def ns_to_ms(df: Any) -> Any:
    """Add ``<x>_ms`` next to every ``<x>_ns`` column."""
    return with_units(df, {c[:-3] + "_ms": (c, NS_PER_MS) for c in df.columns if c.endswith("_ns")})


def data_table(df: Any, caption: str | None = None, *, hide_ns: bool = True, height: int | None = None,
               keep_run: bool = False) -> None:
    """The exact numbers behind a chart. ``*_ns`` columns are hidden when an ``*_ms`` twin exists;
    the ``run`` column too (the page's title names the run) unless ``keep_run``."""
    if not keep_run and "run" in df.columns:
        df = df.drop(columns=["run"])
    if hide_ns:
        df = df[[c for c in df.columns if not (c.endswith("_ns") and c[:-3] + "_ms" in df.columns)]]
    reasons = [c for c in df.columns if c.endswith("reason")]
    df = df[[c for c in df.columns if c not in reasons] + reasons]  # why-not columns last
    if caption:
        st.caption(caption)
    kwargs = {"height": height} if height else {}
    st.dataframe(df, hide_index=True, width="stretch", column_config=column_units(df.columns), **kwargs)


def column_units(columns: Any) -> dict[str, Any]:
    """How each column reads, by the unit its name carries (:func:`stepscope.units.unit_for_key`):
    ms with their unit, bytes in KB/MB/GB, percentages with %, names wide (the whole name on
    hover). The values stay the analysis layer's numbers, so the table sorts and copies exactly."""
    config: dict[str, Any] = {}
    for column in columns:
        unit = "ms" if column.endswith("_ms") else unit_for_key(column)
        if unit == "ms":
            config[column] = st.column_config.NumberColumn(column, format="%.3f ms")
        elif unit == "bytes":
            config[column] = st.column_config.NumberColumn(column, format="bytes")
        elif unit == "pct":
            config[column] = st.column_config.NumberColumn(column, format="%.1f%%")
        elif unit == "gbps":
            config[column] = st.column_config.NumberColumn(column, format="%.3g GB/s")
        elif unit == "name":
            config[column] = st.column_config.TextColumn(column, width="large")
    return config


def chart(spec: alt.TopLevelMixin) -> None:
    """Draw an Altair chart across the page."""
    st.altair_chart(spec, width="stretch")


def bar_width(bars: int) -> int:
    """Pixel width of one bar among ``bars`` across the page: narrow enough to fit, never a slab."""
    return max(2, min(40, 900 // max(bars, 1)))
