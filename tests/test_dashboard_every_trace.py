"""No dashboard page shows a traceback, or a section error, on any trace of ../shared/traces.

Each Kineto trace is ingested once per session (the ``ingested`` fixture) into a store of its
own; one AppTest session per trace opens the dashboard (its first page, the Overview) and then
every other page in turn, with what the pages draw only on demand (``_view.on_demand``: tables,
findings' evidence) drawn at once, so that it is checked too. The Perfetto button, which carries
the rank's whole trace rebuilt from the store (``export_chrome_trace``: the costliest thing a page
draws, and the same code on every trace), is drawn on :data:`PERFETTO_TRACES`, the few small
traces that take every branch of the export that any shared trace takes
(:func:`test_the_perfetto_traces_take_every_branch_of_the_export` keeps it so). Files that are
not Kineto traces (an Execution Trace, a memory-timeline array, a snapshot pickle, TraceLens
sidecars) are refused at ingest, as they should be, and are not pages' business.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from stepscope.dashboard import _view  # noqa: E402
from stepscope.store.export import KINETO_CAT  # noqa: E402
from tests.conftest import REPO, SHARED_TRACES  # noqa: E402

APP = REPO / "stepscope" / "dashboard" / "app.py"
FIRST = "overview"
"""The page the dashboard opens on (app.py's default): the test's first run draws it."""
PAGES = ("runs", "communication", "copies", "memory", "kernels", "pipeline", "compare", "sql")
"""Every other page, opened in turn after it."""
NOT_KINETO = ("execution_details.json", "_et.json.gz", "memory_timeline.raw.gz", ".pickle")
TRACES = sorted(p.relative_to(SHARED_TRACES).as_posix() for p in SHARED_TRACES.rglob("*")
                if p.is_file() and p.name.endswith((".json", ".json.gz")) and not p.name.endswith(NOT_KINETO)
                and p.parent.name != "LICENSES") if SHARED_TRACES.is_dir() else []
PERFETTO_TRACES = {
    "hta/trace_compare/base/base.json.gz":
        "no metadata, schemaVersion or deviceProperties; memcpys and memsets",
    "hta/triton_example/triton_example.json.gz":
        "CUDA driver calls; no distributedInfo; and with the next: events with and without dur and "
        "args, flows ('f' ends among them), pid and tid as labels, metadata, an integer schemaVersion",
    "tracelens/inference/sglang_decode/capture_traces/bs_32_rank0.json.gz":
        "memory events, Python functions and GPU annotations (df_index_resolver, the one other "
        "shared trace with steps and memory events, has its button opened in "
        "tests/test_dashboard_apptest.py)",
}
"""The traces whose Overview draws the Perfetto button, with the export's branches each takes that
the others do not (the branches: :func:`_export_branches`). Their buttons export 62k events;
the buttons of all 26 traces with steps, 1.8M."""


@pytest.mark.shared
@pytest.mark.slow
@pytest.mark.parametrize("relative", TRACES)
def test_every_page_renders_on_every_shared_trace(relative: str, ingested, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["app.py", "--store", str(ingested(relative))])
    monkeypatch.setattr(_view, "on_demand", functools.partial(_drawn_at_once, perfetto=relative in PERFETTO_TRACES))
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.run()
    _assert_drawn(at, FIRST)
    assert at.title[0].value.startswith("Overview"), [t.value for t in at.title]
    if relative in PERFETTO_TRACES:
        assert at.get("iframe"), "no Perfetto button drawn"
    for page in PAGES:
        at.switch_page(f"views/{page}.py")
        at.run()
        _assert_drawn(at, page)


@pytest.mark.shared
def test_the_perfetto_traces_take_every_branch_of_the_export(ingested) -> None:
    """Every branch of the export that a shared trace with steps takes (those are the traces whose
    Overview has the button), one of :data:`PERFETTO_TRACES` takes too; and each of them has steps.
    A new shared trace that takes a new branch fails here until it is added."""
    taken = _export_branches({relative: ingested(relative) for relative in TRACES})
    assert set(PERFETTO_TRACES) <= set(taken), set(PERFETTO_TRACES) - set(taken)
    missed = set().union(*taken.values()) - set().union(*(taken[r] for r in PERFETTO_TRACES))
    assert not missed, {branch: [r for r in taken if branch in taken[r]] for branch in missed}


def _export_branches(stores: dict[str, Path]) -> dict[str, set[str]]:
    """Which branches ``export_chrome_trace`` takes on each store's one trace, for the stores with
    steps: each optional field of an event written or not, each ``kind``'s Kineto category (or
    ``other`` for one it does not map), each top-level key present or not. Read from the stores'
    parts (docs/STORE.md's layout) in three queries over all of them, rather than by opening
    each store (~0.1 s each)."""
    import duckdb

    def parts(table: str) -> dict[str, str]:
        return {str(part): relative for relative, store in stores.items() for part in (store / table).rglob("*.parquet")}

    def rows(table: str, columns: str) -> dict[str, list[dict[str, object]]]:
        files = parts(table)
        relation = duckdb.sql(f"SELECT DISTINCT filename, {columns} FROM read_parquet({sorted(files)!r}, "
                               "filename = true, union_by_name = true)")
        by_store: dict[str, list[dict[str, object]]] = {}
        for row in relation.fetchall():
            record = dict(zip(relation.columns, row))
            by_store.setdefault(files[record.pop("filename")], []).append(record)
        return by_store

    with_steps = rows("rank_step_windows", "true AS stepped")
    sources = rows("sources", "coalesce(metadata, '') <> '' AS metadata, trace_schema_version AS version, "
                              "device_properties IS NOT NULL AS device_properties, "
                              "distributed_info IS NOT NULL AS distributed_info")
    events = rows("events", "ts_ns IS NULL AS no_ts, dur_ns IS NULL AS no_dur, pid IS NULL AS pid_label, "
                            "tid IS NULL AS tid_label, flow_id IS NULL AS no_flow, ph::VARCHAR = 'f' AS flow_end, "
                            "coalesce(args, '') = '' AS no_args, kind::VARCHAR AS kind")
    taken: dict[str, set[str]] = {}
    for relative in with_steps:
        [source] = sources[relative]  # one trace per store: the export's one-source case
        version = source.pop("version")
        branches = {f"{key}={value}" for key, value in source.items()}
        branches.add("schemaVersion=" + ("none" if version is None else "int" if version.isdigit() else "text"))
        for e in events[relative]:
            branches |= {f"{field}={e[field]}" for field in ("no_ts", "no_dur", "pid_label", "tid_label", "no_args")}
            branches.add("flow=" + ("none" if e["no_flow"] else "end" if e["flow_end"] else "other"))
            branches.add("cat=" + KINETO_CAT.get(e["kind"], "other (unmapped)"))
        taken[relative] = branches
    return taken


def _drawn_at_once(label: str, key: str, draw: Callable[[], None], *, icon: str | None = None,
                   perfetto: bool) -> None:
    """``_view.on_demand`` as if every such expander had been opened (the pages import it when
    they run, so the patch reaches them); the Perfetto button's only where ``perfetto``."""
    if key != "perfetto" or perfetto:
        draw()


def _assert_drawn(at: AppTest, page: str) -> None:
    """The page's run showed no traceback, no section error, and its title."""
    assert not at.exception, (page, [e.value for e in at.exception])
    assert not at.error, (page, [e.value for e in at.error])
    assert at.title, (page, "no title")
