"""The verdict: the summary's first screen and the JSON ``verdict``, against the breakdowns'
own rows and a golden file (regenerated only with ``pytest --update-golden``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from stepscope.analysis.breakdown import host_breakdown
from stepscope.store.rankstats.parts import HOST
from stepscope.analysis.quantiles import median
from stepscope.analysis.summary import build_summary
from stepscope.commands.summary import render_markdown, render_table
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from tests.conftest import REPO, load_raw, write_trace

LATE = REPO / "sample_traces" / "gloo-3ranks-late"


@pytest.fixture(scope="module")
def late(sample_run: Callable[[str], Path]) -> tuple[Any, dict[str, Any]]:
    """The sample run ``gloo-3ranks-late`` (the session's shared store) and its summary."""
    store = open_store(sample_run(LATE.name))
    return store, build_summary(store, store.sql("SELECT run FROM runs").to_pylist()[0]["run"])


def test_verdict_is_the_median_step_its_parts_and_the_findings(late) -> None:
    store, doc = late
    v = doc["verdict"]
    rows = host_breakdown(store, doc["run"]).to_pylist()
    assert v["breakdown"] == "host" and v["ranks"] == 3 and v["steps"] == 4
    assert v["step_ns"] == round(median(r["dur_ns"] for r in rows))
    total = sum(r["dur_ns"] for r in rows)
    shares = {p.name: sum(r[p.column] for r in rows) / total for p in HOST.leaves()}
    assert sum(shares.values()) == pytest.approx(1)
    expected = sorted(((n, s) for n, s in shares.items() if s >= 0.05), key=lambda x: -x[1])[:4]
    assert [(b["part"], b["share"]) for b in v["bound_by"]] == [(n, round(s, 4)) for n, s in expected]
    assert v["bound_by"][0]["part"] == "communication_wait"  # two of three ranks wait ~30 ms of ~33
    mean = sum(r["dur_ns"] for r in rows) / len(rows)
    assert v["basis"]["step_ns"] == v["mean_step_ns"] == round(mean) and v["basis"]["windows"] == len(rows)
    assert all(b["ns"] == round(shares[b["part"]] * mean) for b in v["bound_by"])  # of the basis, the mean step
    assert all(f["share_of_step"] == round(f["time_at_stake_ns"] / mean, 4) for f in v["findings"])
    assert v["findings"] == doc["findings"] and v["findings"][0]["rule"] == "comm.late_rank"
    stakes = [f["time_at_stake_ns"] for f in v["findings"]]
    assert all(isinstance(s, int) for s in stakes) and stakes == sorted(stakes, reverse=True)
    assert v["findings"][0]["ranks"] == [2]


def test_first_screen_matches_its_golden_file(late, golden) -> None:
    _, doc = late
    screen = render_table(doc, width=120)
    assert "rank 2 arrived late at the all_reduce" in screen and "rank 0: GPU time" not in screen
    golden("summary_first_screen.txt", screen + "\n")
    golden("summary_first_screen.md", render_markdown(doc) + "\n")


def _as_rank(path: Path, rank: int, world: int, out: Path) -> Path:
    """A recorded rank's trace relabelled as rank ``rank`` of a ``world``-rank job."""
    doc = load_raw(path)
    info = doc["distributedInfo"]
    info.update(rank=rank, world_size=world)
    info["pg_config"] = [{**info["pg_config"][0], "pg_size": world, "ranks": list(range(world))}]
    return write_trace(out / f"rank{rank}.json.gz", doc["traceEvents"],
                       **{k: v for k, v in doc.items() if k != "traceEvents"})


def test_first_screen_of_eight_ranks_fits_forty_lines(tmp_path: Path) -> None:
    """Eight ranks: five copies of a waiting rank of gloo-3ranks-late and three of its sleeping
    rank (they arrive 30 ms late together). The summary of 8 ranks printed 521 lines before; the
    first screen is at most 40, untruncated, and names the three late ranks in one finding."""
    waiting, sleeping = LATE / "rank0.pt.trace.json.gz", LATE / "rank2.pt.trace.json.gz"
    paths = [_as_rank(waiting if r < 5 else sleeping, r, 8, tmp_path / "traces") for r in range(8)]
    assert ingest_paths(paths, tmp_path / "store", "eight").ok
    summary = build_summary(open_store(tmp_path / "store"), "eight")
    screen = render_table(summary, width=160)
    assert len(screen.splitlines()) <= 40, screen
    late = [f for f in summary["verdict"]["findings"] if f["rule"] == "comm.late_rank"]
    assert [f["ranks"] for f in late] == [[5, 6, 7]] and late[0]["evidence"]["waiting_ranks"] == [0, 1, 2, 3, 4]
    assert late[0]["message"].startswith("ranks 5-7 arrived late at the all_reduce")
    flat = " ".join(screen.split())  # the findings column wraps; every word of each message is there
    assert all(f["message"] in flat for f in summary["verdict"]["findings"][:8])
