"""The watch on a real 2-rank gloo job: a slow step on one rank leaves a capture on both.

Three jobs (tests/watch_support.py), each a few seconds on 2 cores: DDP where rank 1 stalls
``STALL_S`` at the end of steps 50 and 100 under a budget of one capture per hour; the same job
without the stalls; and a job whose rank 1 dies while rank 0 waits for it in the watch's
all-gather. A step is slow at 4x and ``min_slow_ms`` over its reference (a ~55 ms step, judged
from step 15 on). A loaded shared machine really does slow a rank's step now and then (under
load rank 1 once took 4x and over 100 ms longer at step 64, with no stall injected), which the
watch rightly counts; so the injected stall is made unmistakable against such slowness instead:
the threshold is well above what a busy machine adds to one step, and the stall twice the
threshold, so every assertion on exactly which steps were slow stays as strict as it was.
That makes the file hold beside the rest of the suite (it passed at load 7-10, with the
suite's two workers running), so it runs beside the rest, not on a machine of its own: a
watch that needs a quiet machine to name the right rank would be the defect (issue 20, item 5).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import stepscope  # noqa: E402
from stepscope.store import open_store  # noqa: E402
from tests.conftest import load_raw  # noqa: E402
from tests.watch_support import WatchJob, run_job  # noqa: E402

pytestmark = pytest.mark.slow  # judges fresh timings, on a loaded machine too: runs beside the other tests

WATCH = stepscope.Watch(slow_factor=4, min_slow_ms=750, warmup_steps=15, every=10, capture_steps=3,
                        max_per_hour=1, timeout_s=5)
STALL_S = 1.5
"""Rank 1's stall at each step of ``SLOW_AT``: twice ``min_slow_ms``, ~27x an ordinary step."""
TIMERS_APART_NS = 1_000_000
"""How far the watch's time of a step's work and the job's own (``works_ns``) may differ: both
time the work between two ``prof.step()`` calls, from either side of the loop's bookkeeping."""
SLOW_AT = (50, 100)
"""Steps where rank 1 is slow. A trace may still be converting then (its niced child takes many
seconds on a loaded machine): the step is then judged against rank 0's time of the same step
(``slow_vs_ranks``) instead of rank 1's rolling median (``slow_step``); either names rank 1."""
KINDS = ("slow_step", "slow_vs_ranks")
SCHEDULED = [4, 5]  # wait=3, warmup=1, active=2


def _expected_window(trigger_step: int) -> list[int]:
    """The documented rule: act at the first exchange at or after the trigger (the end of a step
    E with (E + 1) % every == 0), warm the profiler up for capture_warmup steps, record
    capture_steps."""
    agreed = trigger_step + (-(trigger_step + 1)) % WATCH.every
    first = agreed + 1 + WATCH.capture_warmup
    return list(range(first, first + WATCH.capture_steps))


@pytest.fixture(scope="module")
def slow_job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("watch-slow")
    job = WatchJob(store=str(root / "store"), run="watched", watch=WATCH, slow_at=SLOW_AT,
                   stall_s=STALL_S, trace_dir=str(root / "traces"))
    reports, exits = run_job(job)
    assert exits == [0, 0], [r["log"] for r in reports.values()]
    return {"job": job, "reports": reports, "store": open_store(job.store), "traces": root / "traces"}


def test_slow_step_on_rank_1_is_captured_on_both_ranks(slow_job: dict[str, Any],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    store, reports = slow_job["store"], slow_job["reports"]
    captured = _expected_window(SLOW_AT[0])
    # Both ranks agreed on the same window, named after rank 1's slow step.
    for rank in (0, 1):
        assert reports[rank]["captures"] == [(captured[0], captured[-1], 1, SLOW_AT[0])], reports[rank]["log"]
        assert reports[rank]["enabled"]
    rows = store.sql("SELECT * EXCLUDE (source, run) FROM captures ORDER BY rank").to_pylist()
    agreed = captured[0] - 1 - WATCH.capture_warmup
    kind = rows[0]["trigger_kind"]
    assert kind in KINDS
    assert [{k: r[k] for k in ("rank", "first_step", "last_step", "trigger_kind", "trigger_rank",
                              "trigger_step", "agreed_step")} for r in rows] == [
        {"rank": rank, "first_step": captured[0], "last_step": captured[-1], "trigger_kind": kind,
         "trigger_rank": 1, "trigger_step": SLOW_AT[0], "agreed_step": agreed} for rank in (0, 1)]
    # The trigger's numbers against what rank 1 did and what the step timer saw.
    observed, reference = rows[0]["observed_ns"], rows[0]["reference_ns"]
    assert rows[1]["observed_ns"] == observed and rows[1]["reference_ns"] == reference
    timed = {r["step"]: r["wall_ns"] for r in store.sql(
        "SELECT step, wall_ns FROM step_times WHERE rank = 1 ORDER BY step").to_pylist()}
    assert reports[1]["slept_ns"][SLOW_AT[0]] <= observed <= timed[SLOW_AT[0]]
    # The reference is an ordinary step's work: the median of the steps the watch judged before
    # (those stepscope did not disturb), within the range of rank 1's own work in its ordinary
    # steps before the slow step; or rank 0's time of that step scaled by how the ranks usually
    # compare (which can fall outside rank 1's own range: rank 0's step can be a fast one).
    # Work, as the rank timed it, not step_times' wall: the wall also holds stepscope's time at
    # the step boundary, which the watch leaves out and a loaded machine stretches (a reference
    # 0.6 ms under every wall before it, at load 12).
    works = reports[1]["works_ns"]
    if kind == "slow_step":
        before = [works[s] for s in range(SLOW_AT[0]) if s not in SCHEDULED]
        assert min(before) <= reference <= max(before)
    else:
        # rank 0's work at the slow step, times the median ratio of rank 1's work to rank 0's over
        # the steps the exchange carried (SLOW_AT .. the agreed step): within the ratios of its
        # ordinary steps (those two outliers aside: the stall, and rank 0 waiting for it the
        # step after), give or take what two timers of the same work differ by
        ratios = [works[s] / reports[0]["works_ns"][s] for s in range(SLOW_AT[0] + 2, agreed + 1)]
        at = reports[0]["works_ns"][SLOW_AT[0]]
        assert min(ratios) * at - TIMERS_APART_NS <= reference <= max(ratios) * at + TIMERS_APART_NS, (ratios, at)
    assert observed > WATCH.slow_factor * reference
    # The store holds that window on both ranks, next to the scheduled one.
    windows = store.sql("SELECT rank, kind, list(step ORDER BY step) AS steps FROM windows w "
                        "JOIN steps s USING (run, rank, source) GROUP BY ALL ORDER BY rank, kind DESC"
                        ).to_pylist()
    assert windows == [{"rank": r, "kind": k, "steps": s} for r in (0, 1)
                       for k, s in (("schedule", SCHEDULED), ("capture", captured))]
    for rank in (0, 1):  # and the raw trace of the capture says the same
        raw = load_raw(slow_job["traces"] / f"rank{rank}.cycle1.pt.trace.json.gz")
        names = sorted(e["name"] for e in raw["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
        assert names == sorted(f"ProfilerStep#{s}" for s in captured)
    # The cross-rank analysis of the captured steps: every collective matched on both ranks,
    # as many per step as gloo transfers in each rank's raw trace of that step.
    from stepscope.analysis.comm import collective_instances

    instances = [r for r in collective_instances(store, "watched").to_pylist() if r["step"] in captured]
    assert instances and all(r["ranks"] == 2 and r["absent_reason"] is None
                             and r["start_skew_ns"] is not None for r in instances)
    for rank in (0, 1):
        raw = load_raw(slow_job["traces"] / f"rank{rank}.cycle1.pt.trace.json.gz")
        assert _gloo_transfers_per_step(raw) == {s: sum(1 for r in instances if r["step"] == s)
                                                 for s in captured}
    # `stepscope runs` and `summary` list the capture with its trigger beside the schedule.
    from stepscope.cli import main

    assert main(["runs", "--store", slow_job["job"].store, "--format", "json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)
    assert (run["scheduled_steps"], run["captures"], run["capture_windows"]) == (
        f"{SCHEDULED[0]}-{SCHEDULED[-1]}", 1, f"{captured[0]}-{captured[-1]} {kind} r1@{SLOW_AT[0]}")
    assert main(["summary", "--store", slow_job["job"].store, "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)["windows"]
    assert [(w["kind"], w["first_step"], w["last_step"], w["ranks"], w["trigger_rank"], w["trigger_step"],
             w["latency_steps"]) for w in listed] == [
        ("schedule", SCHEDULED[0], SCHEDULED[-1], 2, None, None, None),
        ("capture", captured[0], captured[-1], 2, 1, SLOW_AT[0], captured[0] - SLOW_AT[0])]


def _gloo_transfers_per_step(raw: dict[str, Any]) -> dict[int, int]:
    """gloo worker-thread transfers (``gloo:*`` annotations) inside each ProfilerStep window."""
    steps = [(int(e["name"].split("#")[1]), e["ts"], e["ts"] + e["dur"]) for e in raw["traceEvents"]
             if e.get("name", "").startswith("ProfilerStep#")]
    counts = {step: 0 for step, _, _ in steps}
    for event in raw["traceEvents"]:
        if event.get("cat") == "user_annotation" and event.get("name", "").startswith("gloo:"):
            for step, start, end in steps:
                if start <= event["ts"] <= end:
                    counts[step] += 1
    return counts


def test_budget_of_one_capture_counts_the_second_anomaly(slow_job: dict[str, Any]) -> None:
    for rank in (0, 1):
        report = slow_job["reports"][rank]
        assert report["anomalies"] == len(SLOW_AT)
        assert len(report["captures"]) == 1 and report["not_captured"] == {"budget": 1}
        assert any(f"slow step {SLOW_AT[1]} on rank 1" in line and "not captured (budget)" in line
                   for _, line in report["log"]), "\n".join(line for _, line in report["log"])
    assert slow_job["store"].sql("SELECT count(*) AS n FROM captures").to_pylist() == [{"n": 2}]


def test_same_job_without_the_sleep_captures_only_the_schedule(tmp_path: Path) -> None:
    job = WatchJob(store=str(tmp_path / "store"), run="calm", watch=WATCH)
    reports, exits = run_job(job)
    assert exits == [0, 0]
    for rank in (0, 1):
        assert (reports[rank]["anomalies"], reports[rank]["captures"]) == (0, []), reports[rank]["log"]
    store = open_store(job.store)
    assert store.sql("SELECT count(*) AS n FROM captures").to_pylist() == [{"n": 0}]
    assert store.sql("SELECT rank, kind, first_step, last_step FROM windows ORDER BY rank").to_pylist() == [
        {"rank": r, "kind": "schedule", "first_step": SCHEDULED[0], "last_step": SCHEDULED[-1]} for r in (0, 1)]


def test_rank_killed_during_the_exchange_does_not_block_the_other(tmp_path: Path) -> None:
    """Rank 1 dies half a second after rank 0 entered the all-gather at step 19 (no DDP: rank
    0's own training has no collectives, so it can go on alone)."""
    job = WatchJob(store=str(tmp_path / "store"), run="lost", watch=WATCH, die_at=19, ddp=False,
                   strict=False, convert="process", steps=60)
    reports, exits = run_job(job, timeout_s=120)
    assert exits[1] == -9 and exits[0] == 0
    survivor = reports[0]
    assert len(survivor["walls_ns"]) == job.steps and survivor["enabled"] is False
    # The failing exchange cost rank 0 at most the watch's deadline, every other step stays short.
    walls = survivor["walls_ns"]
    assert walls[19] < (WATCH.timeout_s + 1) * 1e9
    assert max(walls[20:]) < 1e9
    warnings = [line for level, line in survivor["log"] if level == "WARNING"]
    assert len(warnings) == 1 and "the watch is off from step 19" in warnings[0], survivor["log"]
