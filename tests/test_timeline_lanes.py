"""The step timeline when a run has more ranks than it can draw lanes for: which ranks it draws
(``timeline_lanes``), the timeline of those ranks alone (``step_timeline(ranks=...)``), and the
Overview drawing them with a caption that says so."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from stepscope.analysis.absent import Absent
from stepscope.analysis.breakdown import step_windows
from stepscope.analysis.timeline import late_marks, step_timeline, timeline_lanes
from stepscope.store import open_store
from tests.conftest import REPO


def test_every_rank_has_a_lane_up_to_the_limit() -> None:
    assert timeline_lanes([3, 1, 2, 2], [2], limit=3) == [1, 2, 3]
    assert timeline_lanes(range(64), [], limit=64) == list(range(64))


def test_the_ranks_worth_a_look_first_then_evenly_spaced_ones() -> None:
    """Beyond the limit: the ranks of ``first`` (in its order, each once, only ranks of the run),
    then evenly spaced ranks of the rest, the lowest and the highest included."""
    lanes = timeline_lanes(range(100), [50, 7, 50, 999], limit=8)
    assert lanes == [0, 7, 20, 40, 50, 60, 80, 99]
    assert timeline_lanes(range(1024), [], limit=5) == [0, 256, 512, 767, 1023]
    assert timeline_lanes(range(1024), [900, 3], limit=2) == [3, 900]  # all the room taken by `first`
    lanes = timeline_lanes(range(1024), [5, 6], limit=64)
    assert len(lanes) == 64 and {5, 6, 0, 1023} <= set(lanes)


def _rows(table: pa.Table) -> list[tuple]:
    return sorted(tuple(r.values()) for r in table.to_pylist())


@pytest.mark.parametrize("run", ["gloo-3ranks-late", "pp-1f1b-4stages"])
def test_the_timeline_of_some_ranks_is_theirs_in_the_whole_timeline(sample_run: Callable[[str], Path],
                                                                     run: str) -> None:
    """Restricted to some ranks, each step's segments are exactly those ranks' segments of the
    whole run's timeline (the waits that cut them are still matched across every rank)."""
    with open_store(sample_run(run)) as store:
        steps = sorted(set(step_windows(store, run).column("step").to_pylist()))
        ranks = sorted(set(store.sql("SELECT rank FROM sources WHERE run = $run", {"run": run})
                           .column("rank").to_pylist()))
        for step in steps[:2]:
            whole = step_timeline(store, run, step)
            assert not isinstance(whole, Absent)
            for some in ([ranks[-1]], ranks[:2]):
                part = step_timeline(store, run, step, ranks=some)
                expected = whole.filter(pc.is_in(whole.column("rank"), pa.array(some, whole.schema.field("rank").type)))
                assert part.num_rows > 0 and _rows(part) == _rows(expected), (step, some)


def test_the_overview_draws_the_late_rank_when_it_cannot_draw_them_all(sample_run: Callable[[str], Path],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Two lanes for a run of three ranks: the rank arriving late in the step is drawn, the
    chart has two lanes, and a caption says how many ranks have one and how they were chosen."""
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    from stepscope.analysis import timeline

    run = "gloo-3ranks-late"
    root = sample_run(run)
    with open_store(root) as store:
        step = min(step_windows(store, run).column("step").to_pylist())
        late = set(late_marks(store, run, step).column("rank").to_pylist())
    assert late, "the sample's late rank arrives late in its first step"
    monkeypatch.setattr(timeline, "TIMELINE_MAX_LANES", 2)
    monkeypatch.setattr(sys, "argv", ["app.py", "--store", str(root)])
    at = AppTest.from_file(str(REPO / "stepscope" / "dashboard" / "app.py"), default_timeout=120)
    at.query_params["run"] = run
    at.run()
    at.switch_page("views/overview.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="timeline_step").value == step
    bars = [pa.ipc.open_stream(d.data.data).read_all() for d in at.get("vega_lite_chart")[0].proto.datasets]
    lanes = {r for t in bars if "label" in t.column_names for r in t.column("rank").to_pylist()}
    assert len(lanes) == 2 and late <= lanes, (lanes, late)
    assert any(c.value.startswith("2 of the 3 ranks chosen have a lane") for c in at.caption), \
        [c.value for c in at.caption]
