"""The dashboard's only door to numbers: cached calls into ``stepscope.analysis``.

Pages never query events themselves. They import an analysis function and hand it to
:meth:`Context.analysis`; its result is computed once per (store, run, sources fingerprint,
function, arguments) and kept by ``st.cache_data``, so a rerun, a filter change or a second visitor reads the cached aggregate
instead of raw events. The fingerprint is the run's list of committed sources: ingesting
another rank into the run changes it, and the next render recomputes. Underneath, the analysis
layer keeps its heavy per-run frames in ``<store>/cache/`` (:mod:`stepscope.analysis.cache`),
so a restarted server reads them back instead of recomputing them.

Analyses are imported, never looked up by name: a renamed or missing one is an ImportError
when the page loads, not a page that quietly says "not available".

Connections: the server opens the store once (its views, in one DuckDB database); each browser
session queries through a connection of its own on it (:func:`store_for`), and the SQL page
opens a sandbox per query, so no visitor's query waits for, or is interrupted with, another's.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import streamlit as st

from stepscope.analysis.absent import Absent
from stepscope.analysis.compare.comparison import compare_runs
from stepscope.store.catalog import Store
from stepscope.store.location import is_url, store_files

Analysis = Callable[..., Any]
"""An analysis function ``f(store, run, **kwargs)`` of :mod:`stepscope.analysis`."""


class StoreProblem(Exception):
    """The store cannot be shown (missing, empty, too new): the message is for the user."""


@st.cache_resource(show_spinner=False)
def _open(root: str) -> Store:
    from stepscope.store import open_store

    return open_store(root)


def store_for(root: str) -> Store:
    """This browser session's ``Store`` of ``root``: a connection of its own on the server's one
    database of views (:meth:`Store.session`), kept in the session's state, so one visitor's
    query never waits for, nor is interrupted with, another's. Outside a session (a thread of
    its own, a test calling a page's helper), the server's shared ``Store``."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    shared = _open(root)
    if get_script_run_ctx(suppress_warning=True) is None:
        return shared
    key = f"_stepscope_store:{root}"
    store = st.session_state.get(key)
    if not isinstance(store, Store):
        store = st.session_state[key] = shared.session()
    return store


def sql_sandbox(root: str) -> Store:
    """A fresh sandboxed ``Store`` for one user query (close it after): the sandbox may read
    only the Parquet parts that exist when it opens, so it is not cached across ingests."""
    from stepscope.store import open_store

    return open_store(root, read_only_sql=True)


@st.cache_data(show_spinner=False, max_entries=16)
def view_columns(root: str, fingerprints: str) -> dict[str, list[str]]:
    """Each view's column names (for the SQL page), cached until the store's runs change."""
    store = store_for(root)
    return {view: store.sql(f"DESCRIBE {view}").column("column_name").to_pylist() for view in store.tables}


REVALIDATE_S = 5.0
"""How often, at most, a page run starts a listing of the store's files in the background."""

_revalidations: dict[str, list[Any]] = {}
"""Per store root: [when its files were last listed (monotonic s), whether a listing runs now]."""
_revalidations_lock = threading.Lock()


@st.cache_data(show_spinner=False)
def runs_table(root: str) -> Any:
    """The store's ``runs`` view plus each run's sources fingerprint, computed after listing the
    store's files again (:meth:`Store.refresh`, which its sessions' views follow). Cached until
    :func:`revalidate` finds the files changed: a new ingest shows up without a restart, and no
    page waits for the listing (a second at 1,024 ranks) to draw what it already knows. A store
    listed less than :data:`REVALIDATE_S` ago (just opened, or just refreshed by
    :func:`revalidate`) is not listed again: a first open would otherwise list it twice."""
    shared = _open(root)
    if shared.listed_age_s() >= REVALIDATE_S:
        shared.refresh()
    store = store_for(root)
    return store.df(
        """
        SELECT r.run, r.name, r.created_at, r.ranks, r.world_size, r.backend, r.gpu_name, r.gpu_count,
               r.trace_schema_version, r.events, r.tags, f.rank_list, f.fingerprint,
               s.first_step, s.last_step
        FROM runs r JOIN (
            SELECT run, list(DISTINCT rank ORDER BY rank) AS rank_list,
                   string_agg(rank || ':' || source, ',' ORDER BY rank, source) AS fingerprint
            FROM sources GROUP BY run
        ) f USING (run)
        LEFT JOIN (SELECT run, min(step) AS first_step, max(step) AS last_step FROM steps GROUP BY run) s
          USING (run)
        ORDER BY r.created_at, r.run
        """
    )


def revalidate(root: str) -> None:
    """List the store's files again in a background thread, at most every :data:`REVALIDATE_S`
    and one listing at a time; when they changed (an ingest, a prune, a compaction), the runs
    table is recomputed at the next page run (stale while revalidating: ``app.py`` starts it
    once a page is drawn, so no page waits for it or shares the interpreter with it while drawing)."""
    now = time.monotonic()
    with _revalidations_lock:
        state = _revalidations.setdefault(root, [now, False])  # runs_table has just listed it
        if state[1] or now - state[0] < REVALIDATE_S:
            return
        state[1] = True
    store = _open(root)

    def listing() -> None:
        try:
            if store.refresh():
                runs_table.clear()
        except Exception:  # noqa: BLE001 - the next page run lists the store itself and says what failed
            runs_table.clear()
        finally:
            with _revalidations_lock:
                state[0], state[1] = time.monotonic(), False

    threading.Thread(target=listing, name="stepscope-store-listing", daemon=True).start()


def open_checked(root: str | None) -> tuple[str, Any]:
    """``(root, runs)`` for a store that can be shown; raises :class:`StoreProblem` otherwise."""
    from stepscope.errors import StepscopeError

    if not root:
        raise StoreProblem("No store given: start the dashboard with `stepscope dashboard --store DIR`.")
    shown = root if is_url(root) else str(Path(root).resolve())
    if not store_files(shown).exists():
        raise StoreProblem(f"{root}: no such store. Ingest traces first: "
                           f"`stepscope ingest TRACES --store {root} --run NAME`.")
    try:
        runs = runs_table(shown)
    except StepscopeError as exc:
        raise StoreProblem(str(exc)) from exc
    if runs.empty:
        raise StoreProblem(f"{root}: the store holds no runs yet. Ingest traces first: "
                           f"`stepscope ingest TRACES --store {root} --run NAME`.")
    return shown, runs


def qualified_name(func: Analysis) -> str:
    """``module.qualname`` of an analysis: its identity in the cache key."""
    return f"{func.__module__}.{func.__qualname__}"


@st.cache_data(show_spinner="Computing this run's aggregates once...", max_entries=512)
def _compute(root: str, run: str, fingerprint: str, name: str, kwargs: tuple[tuple[str, Any], ...],
             _func: Analysis) -> Any:
    """``_func(store, run, **kwargs)``; ``fingerprint`` and ``name`` (the function's
    :func:`qualified_name`) key the cache, ``_func`` itself is not hashed (the leading underscore
    tells Streamlit so).

    In memory for the server's life. Across restarts the analysis layer's own per-run cache
    (``<store>/cache/``, :mod:`stepscope.analysis.cache`) keeps the heavy frames, so a restarted
    server reads them back instead of scanning events again.
    """
    return _func(store_for(root), run, **dict(kwargs))


@st.cache_data(show_spinner="Comparing the runs...", max_entries=64)
def _compare(root: str, baseline: str, baseline_fp: str, candidate: str, candidate_fp: str) -> Any:
    """``compare.compare_runs`` of two runs of the store; the fingerprints key the cache only."""
    store = store_for(root)
    return compare_runs(store, baseline, store, candidate)


@dataclass(frozen=True)
class Context:
    """What every page needs: the store, the chosen runs and the filters."""

    root: str
    runs: Any
    run: str
    baseline: str | None
    ranks: tuple[int, ...]
    all_ranks: tuple[int, ...]
    steps: tuple[int, int] | None

    def fingerprint(self, run: str) -> str:
        row = self.runs.loc[self.runs["run"] == run, "fingerprint"]
        return str(row.iloc[0]) if len(row) else ""

    def analysis(self, func: Analysis, *, run: str | None = None, **kwargs: Any) -> Any:
        """``func(store, run, **kwargs)`` for an imported analysis function, cached."""
        run = run or self.run
        return _compute(self.root, run, self.fingerprint(run), qualified_name(func),
                        tuple(sorted(kwargs.items())), func)

    def section(self, compute: Analysis, *, run: str | None = None) -> Any:
        """A summary section of the run (all ranks), cached: ``compute`` is the section's imported
        compute function (e.g. :func:`stepscope.analysis.comm.comm_section`)."""
        return self.analysis(compute, run=run, ranks=None)

    def findings(self, *, run: str | None = None) -> list[dict[str, Any]]:
        """Every finding of the run (``rule``, ``message``, ``evidence``... as ``stepscope summary``
        lists them), taken from the run's verdict (:func:`stepscope.analysis.summary.summary_verdict`),
        which the Overview has already computed and cached, here and on disk: a page opened
        after it evaluates no section again (computing every section anew cost the
        Communication page 0.4-0.7 s of CPU on a 100k-event trace)."""
        from stepscope.analysis.summary import summary_verdict

        return self.analysis(summary_verdict, run=run)["findings"]

    def compare(self) -> Any:
        """The run against the baseline (``compare.comparison.compare_runs``), cached."""
        if self.baseline is None:
            return Absent("no baseline chosen: pick one in the sidebar")
        return _compare(self.root, self.baseline, self.fingerprint(self.baseline), self.run,
                        self.fingerprint(self.run))

    @property
    def store(self) -> Store:
        return store_for(self.root)


def trace_bytes(ctx: Context, run: str, rank: int) -> bytes:
    """A rank's trace for Perfetto: the file it was ingested from when it is still there
    unchanged, else the stored events exported as a Chrome trace (gzipped JSON either way)."""
    import gzip

    from stepscope.store.export import export_chrome_trace, original_trace

    original = original_trace(ctx.store, run, rank)
    if original is not None:
        data = original.read_bytes()
        return data if data[:2] == b"\x1f\x8b" else gzip.compress(data, compresslevel=1)
    return gzip.compress(export_chrome_trace(ctx.store, run, rank), compresslevel=1)


def context() -> Context:
    """The page context that ``app.py`` put in the session before running the page."""
    ctx = st.session_state.get("ctx")
    if not isinstance(ctx, Context):
        st.error("Open the dashboard through its main page (`stepscope dashboard --store DIR`).")
        st.stop()
    return ctx


def store_root_from_argv(argv: list[str]) -> str | None:
    """The ``--store DIR`` given after ``--`` on the ``streamlit run`` command line.

    The store comes only from the command line (or ``STEPSCOPE_STORE`` set by whoever started
    the server), never from the URL: a visitor cannot point the app at another folder.
    """
    for i, arg in enumerate(argv):
        if arg == "--store" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--store="):
            return arg.split("=", 1)[1]
    return os.environ.get("STEPSCOPE_STORE")
