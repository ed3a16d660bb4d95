"""SQL: a read-only console over the store's views, with a row cap and a time limit.

Each query opens the store's sandbox afresh (``read_only_sql=True``): only the Parquet parts the
store holds at that moment are readable, no extensions, settings frozen, DuckDB's memory limit
(``$STEPSCOPE_MEMORY_LIMIT``, else half of RAM); ``read_only_query`` accepts one SELECT or
EXPLAIN statement and interrupts it at the time limit.
"""

from __future__ import annotations

import time

import streamlit as st

from stepscope.dashboard._data import context, sql_sandbox, view_columns
from stepscope.dashboard._view import guarded
from stepscope.errors import StepscopeError

MAX_ROWS = 10_000
TIME_LIMIT_S = 10.0
EXAMPLE = """SELECT rank, step, count(*) AS kernels, sum(dur_ns) / 1e6 AS kernel_ms
FROM events
WHERE run = $run AND kind = 'kernel'
GROUP BY ALL ORDER BY rank, step"""

ctx = context()
st.title("SQL")
st.caption(f"Read-only DuckDB over the store. `$run` is bound to the chosen run (**{ctx.run}**). "
           f"At most {MAX_ROWS:,} rows, {TIME_LIMIT_S:.0f} s per query.")
with guarded("SQL"):
    with st.expander("Views and columns"):
        for view, columns in view_columns(ctx.root, ",".join(ctx.runs["fingerprint"])).items():
            st.markdown(f"**{view}**: " + ", ".join(f"`{c}`" for c in columns))

    query = st.text_area("Query", EXAMPLE, height=160, key="sql_query")
    if st.button("Run", type="primary", icon=":material/play_arrow:") or st.session_state.get("sql_ran") == query:
        st.session_state["sql_ran"] = query
        params = {"run": ctx.run} if "$run" in query else None
        limit_s = float(st.session_state.get("sql_time_limit_s", TIME_LIMIT_S))  # tests shorten it
        started = time.perf_counter()
        try:
            with sql_sandbox(ctx.root) as store:
                rows, truncated = store.read_only_query(query, params, max_rows=MAX_ROWS, timeout_s=limit_s)
        except StepscopeError as exc:
            st.error(str(exc), icon=":material/error:")
        else:
            elapsed = time.perf_counter() - started
            note = f" (cut at {MAX_ROWS:,} rows)" if truncated else ""
            st.caption(f"{rows.num_rows:,} rows{note} in {elapsed:.2f} s")
            st.dataframe(rows.to_pandas(), hide_index=True, width="stretch")
