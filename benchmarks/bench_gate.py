"""The CI gate on a shared, noisy runner: false alarms on unchanged code, detection of a known
slowdown, with a background load and without (issue 25).

Targets, with the load and without: 0 false alarms in 20 unchanged pairs; a 4x slowdown caught
20/20; a 1.3x slowdown caught at least 18/20 or declared inconclusive, never passed as "ok". The
same for the pytest plugin on a project of four tests (two sharing a marker's baseline folder,
one parametrised).

Method. The workload is a small MLP trained on one thread. A slowdown trains on a larger batch:
the same ops, the same calls per step (the comparability checks pass, as they do for a model
made wider). The batch of each slowdown is **calibrated** first, in this process: the training
thread's CPU time per step (the measure the gate judges) is measured for the candidate batches,
interleaved with the unchanged one, and each batch is scaled twice by its measured shortfall
from 1.3x and 4x (a batch 1.3 times as large is not 1.3 times the CPU time: per-step costs that
do not grow with the batch, and caches, bend it). Each part is calibrated in its own measure:
the compare part's runs profile one step of 20, so its steps are timed bare; the plugin profiles
every step it judges, so its batches are timed under ``torch.profiler`` with the plugin's flags,
whose per-op cost does not grow with the batch. Under heavy load the calibration is noisy
itself, so the factor each slowdown really had in the judged runs (each pair's candidate value
over its baseline's) is printed beside the rates: that, not the label, is what was detected.

Each condition (``quiet``, then ``loaded``: ``--load`` processes spinning on the CPU for the
whole condition) records, in one process, a stream of ``stepscope.profile`` runs of ``--steps``
steps: three unchanged runs, then per pair ``--candidate-runs`` runs of each kind (unchanged,
1.3x, 4x), interleaved. As in docs/ci.md's workflow, a pull request is judged on its three runs
against the three runs main's baseline keeps, and the unchanged runs of pair i are the baseline of
pair i + 1 (what a merge records). Each candidate is judged with the default budgets
(``step_time:+10%``, ``peak_memory:+10%``) exactly as ``stepscope compare`` judges
(:func:`stepscope.analysis.compare.comparison.compare_profiles` and ``verdict``).

For the record, the same pairs are also judged by the gate as it was before issue 25 (wall
time, one baseline run against one candidate run, Mann-Whitney U over the steps of each at alpha
0.05, the same +10 % threshold and 0.5 ms floor), printed as ``before``.

The plugin part writes the four-test project, saves its baseline (three runs of each test), then
runs ``--sessions`` plain pytest sessions per kind (unchanged, every test 1.3x, every test 4x),
each judging the four tests (re-running grey ones, as the plugin does); each test counts by its
pytest outcome in ``--junitxml``, as CI sees it: failed as a stepscope regression is
``regression``, skipped as ``stepscope: inconclusive`` (the plugin's default) ``inconclusive``,
passed ``ok``, anything else (or an outcome unlike the verdict in its ``stepscope`` property)
``other``, never a pass; "red CI on unchanged code" counts the unchanged tests that failed. Every outcome off target
(unchanged not ok, a slowdown not caught) is printed with its message. Each session's candidate
runs go to a store of their own in the project (``--stepscope-store``), so a ``--keep`` folder
can be judged again.

The machine is shared with other work (other jobs' load comes and goes; the load average is
sampled at every pair and printed): the "quiet" condition is only free of this benchmark's own
load.

Run: python benchmarks/bench_gate.py [--pairs 20] [--steps 20] [--sessions 5] [--part cli|plugin|all]
[--keep DIR]; then ``--rejudge DIR`` judges the kept runs again with the rule as it is now (a
rule's change measured on the same data, without the hour of recording): the compare part's
pairs, and the plugin part's sessions the plugin's way (the first run, then the next while
grey), printing each kind's judged factor.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from stepscope.analysis.compare.metrics import RunProfile  # noqa: E402

IN, HIDDEN = 128, 512
BATCH = 512
"""Rows of the unchanged code's batch: ~3 ms of CPU per step on this machine, so a 1.3x
slowdown (~+0.9 ms) is over the gate's 0.5 ms floor."""
FAST = {"profile_memory": False, "record_shapes": False}
"""The runs record no memory and no shapes: ~6 s less per run on a loaded 2-core machine, for a
benchmark of the step-time gate (the peak-memory budget abstains)."""
FACTORS = {"unchanged": 1.0, "1.3x": 1.3, "4x": 4.0}
BASELINE_RUNS = 3
TESTS_PER_SESSION = 4
CLI_RED = "exit 1 of docs/ci.md's workflow; an inconclusive exit 4 passes with a warning"
PLUGIN_RED = "failed tests; a test still inconclusive is skipped"


def _spin(parent: int) -> None:  # pragma: no cover - a background load process
    """Busy until the benchmark is gone: a daemon process outlives a parent killed by a signal
    (its ``finally`` never runs), and two such spinners loaded every later run for an hour."""
    while os.getppid() == parent:
        pass


@contextmanager
def background_load(processes: int) -> Iterator[None]:
    """``processes`` processes busy on the CPU while the block runs (none for 0)."""
    workers = [multiprocessing.Process(target=_spin, args=(os.getpid(),), daemon=True) for _ in range(processes)]
    for w in workers:
        w.start()
    try:
        yield
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.join()


def make_model() -> tuple[object, object]:
    """The MLP (torch pinned to one thread) and a pool of input rows large enough for 4x."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1))
    return model, torch.randn(8 * BATCH, IN)


def _profiled(steps: int) -> contextlib.AbstractContextManager[object]:
    """A bare ``torch.profiler.profile`` recording ``steps`` steps after one warm-up step with
    the flags the pytest plugin's ``stepscope.profile`` uses (shapes and memory on): the
    profiler's per-op cost, which does not grow with the batch, is in every step the plugin
    judges."""
    import torch

    from stepscope.collector.options import Recording, Schedule, profiler_kwargs

    return torch.profiler.profile(**profiler_kwargs(Schedule(wait=0, warmup=1, active=steps), Recording()))


def calibrate(profiled: bool, rounds: int = 15, steps: int = 8) -> dict[str, int]:
    """Batch rows per kind whose median CPU time per step is the kind's factor times the
    unchanged batch's, in the measure the part judges: measured interleaved (so load changes hit
    every batch alike), scaled by the measured shortfall, measured again. ``profiled``: every
    step under the profiler, as the pytest plugin records them (the compare part's runs profile
    one step of 20, so its steps are timed bare)."""
    from stepscope.analysis.quantiles import median

    model, pool = make_model()
    batches = {kind: round(BATCH * f) for kind, f in FACTORS.items()}

    def ratios() -> dict[str, float]:
        times: dict[str, list[float]] = {kind: [] for kind in FACTORS}
        for _ in range(rounds):
            for kind, rows in batches.items():
                data = pool[:rows]
                per_step = []
                with _profiled(steps) if profiled else contextlib.nullcontext() as prof:
                    for step in range(steps + 1):
                        start = time.thread_time_ns()
                        model(data).sum().backward()  # type: ignore[operator]
                        if step:  # the first is the profiler's warm-up (or the bare loop's)
                            per_step.append(time.thread_time_ns() - start)
                        if prof is not None:
                            prof.step()  # type: ignore[attr-defined]
                times[kind].append(median(per_step))
        base = median(times["unchanged"])
        return {kind: median(v) / base for kind, v in times.items()}

    for _ in range(2):
        measured = ratios()
        batches = {kind: round(rows * FACTORS[kind] / measured[kind]) if kind != "unchanged" else rows
                   for kind, rows in batches.items()}
    measured = ratios()
    print(f"calibrated slowdowns ({'profiled' if profiled else 'bare'} steps' CPU time against the unchanged batch, "
          "measured interleaved): " + ", ".join(f"{k}: batch {batches[k]} rows, {measured[k]:.2f}x" for k in FACTORS))
    return batches


class Workload:
    """The MLP and its data, built once; ``record`` stores one run of a kind's batch."""

    def __init__(self, batches: dict[str, int]) -> None:
        self.model, pool = make_model()
        self.data = {kind: pool[:rows] for kind, rows in batches.items()}  # type: ignore[index]

    def record(self, store: Path, run: str, kind: str, steps: int) -> None:
        import stepscope

        data = self.data[kind]
        with stepscope.profile(store=store, run=run, wait=0, warmup=1, active=1, convert="thread", **FAST) as prof:
            for _ in range(steps):
                self.model(data).sum().backward()  # type: ignore[operator]
                prof.step()


def _before(base: list[float], cand: list[float]) -> str:
    """The gate before issue 25 on one baseline run and one candidate: wall time, Mann-Whitney U
    over the steps of one run (regression when over +10 % and the 0.5 ms floor and p < 0.05)."""
    from stepscope.analysis.compare.stats import mann_whitney_greater
    from stepscope.analysis.quantiles import median

    b_med, c_med = median(base), median(cand)
    if c_med - b_med <= 0.10 * b_med or c_med - b_med <= 500_000:
        return "pass"
    return "regression" if mann_whitney_greater(base, cand).p_value < 0.05 else "pass"


def _walls(profile: RunProfile) -> list[float]:
    walls = profile.samples["wall_time"]
    assert isinstance(walls, list), walls
    return walls


class LoadSamples:
    """The load average, sampled while a condition runs."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def sample(self) -> None:
        self.values.append(os.getloadavg()[0])

    def text(self) -> str:
        v = sorted(self.values) or [os.getloadavg()[0]]
        return f"load average {v[0]:.1f}-{v[-1]:.1f} (median {v[len(v) // 2]:.1f}, {len(v)} samples)"


def cli_part(condition: str, pairs: int, steps: int, cand_runs: int, batches: dict[str, int] | None, root: Path,
             load: LoadSamples) -> dict[str, Counter[str]]:
    """Record and judge ``pairs`` pairs of each kind under the current load; outcome counts per
    kind, and per kind with ``before:`` for the old gate. ``batches`` None: record nothing, judge
    the runs a ``--keep`` folder holds (``--rejudge``: a rule changed, the same data judged again)."""
    from stepscope.analysis.compare import DEFAULT_BUDGETS, parse_budgets, verdict
    from stepscope.analysis.compare.budgets import floors
    from stepscope.analysis.compare.comparison import compare_profiles, profiles, side_source
    from stepscope.analysis.quantiles import median
    from stepscope.store import open_store

    work = None if batches is None else Workload(batches)
    if work is not None:
        work.record(root / "warm-up", "w", "unchanged", steps)  # a process's first profile pays one-time costs

    def store(run: str) -> Path:
        """A store per run: a query's cost grows with the runs of its store, not the point here."""
        return root / f"cli-{condition}" / run

    def record(runs: list[str]) -> None:
        for run in runs if work is not None else ():
            work.record(store(run), run, run.split("-")[0], steps)

    budgets, table = parse_budgets(list(DEFAULT_BUDGETS)), floors()
    counts: dict[str, Counter[str]] = {}
    reasons: Counter[str] = Counter()
    unchanged_deltas: list[str] = []
    judged: dict[str, list[float]] = {kind: [] for kind in FACTORS}
    decided: dict[str, Counter[str]] = {kind: Counter() for kind in FACTORS}
    baseline = [f"unchanged-base{j}" for j in range(BASELINE_RUNS)]
    gathered: dict[str, RunProfile] = {}

    def gather(runs: list[str]) -> None:
        """Record ``runs`` and gather each once (what compare_sides does per comparison)."""
        record(runs)
        with contextlib.ExitStack() as stack:
            refs = [(stack.enter_context(open_store(store(r))), r) for r in runs]
            gathered.update(zip(runs, profiles(refs, side_source(refs))))  # type: ignore[arg-type]

    gather(baseline)
    for i in range(pairs):
        load.sample()
        sides = {kind: [f"{kind}-{i}.{j}" for j in range(cand_runs)] for kind in FACTORS}
        gather([sides[kind][j] for j in range(cand_runs) for kind in FACTORS])  # interleaved
        base = [gathered[r] for r in baseline]
        for kind, cands in sides.items():
            comparison = compare_profiles(base, [gathered[r] for r in cands])
            result = verdict(comparison, budgets, table)
            counts.setdefault(kind, Counter())[result.status] += 1
            counts[kind]["red"] += result.status == "regression"  # docs/ci.md's workflow: exit 4 is a warning
            step = comparison.metric("step_time")
            decided[kind].update(r.decided_by for r in result.results if r.budget.metric == "step_time")
            judged[kind].append((step.cand_value or 0) / (step.base_value or 1))
            noise = step.noise
            if kind == "unchanged":
                loaded = noise is not None and noise.load is not None and noise.load.inflation > 0
                unchanged_deltas.append(f"{step.delta_pct:+.0f}%{'L' if loaded else ''}"
                                        f"{'!' if result.status == 'regression' else '?' if result.status == 'inconclusive' else ''}")
            if result.status != "pass":
                reasons[f"{kind} {result.status}: {result.reasons[0][:600]}"] += 1
            old = _before(_walls(base[-1]), _walls(gathered[cands[0]]))
            counts.setdefault(f"before:{kind}", Counter())[old] += 1
        baseline = (baseline + sides["unchanged"])[-BASELINE_RUNS:]
    print(f"\n{condition}: step time from {comparison.step_source}; each kind's judged value against its "
          "baseline's (median over pairs): "
          + ", ".join(f"{k} {median(v):.2f}x (range {min(v):.2f}-{max(v):.2f})" for k, v in judged.items()))
    print("  unchanged pairs' step-time change (L: the load changed, margin widened; !: regression; "
          "?: inconclusive): " + " ".join(unchanged_deltas))
    print("  step-time budget decided by (too_loaded: past the load ceiling): "
          + "; ".join(f"{k} {dict(sorted(v.items()))}" for k, v in decided.items()))
    for reason, n in sorted(reasons.items()):
        print(f"  {n} x {reason}")
    return counts


PROJECT = '''
import json, os, pytest, torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear({inp}, {hidden}), torch.nn.ReLU(), torch.nn.Linear({hidden}, 1))
data = torch.randn(8 * {batch}, {inp})
ROWS = json.loads(os.environ["BENCH_ROWS"])


def train(profile):
    batch = data[: ROWS[os.environ.get("SLOWDOWN", "unchanged")]]
    for _ in range(profile.total_steps):
        model(batch).sum().backward()
        profile.step()


@pytest.mark.stepscope(steps={steps}, baseline="perf/baseline")
def test_train(stepscope_profile):
    train(stepscope_profile)


@pytest.mark.stepscope(steps={steps}, baseline="perf/baseline")
def test_train_again(stepscope_profile):
    train(stepscope_profile)


@pytest.mark.parametrize("batch", [16, 32])
@pytest.mark.stepscope(steps={steps}, baseline="perf/other")
def test_train_param(stepscope_profile, batch):
    train(stepscope_profile)
'''
"""Four tests: two sharing the folder perf/baseline, a parametrised one (two tests) in perf/other."""


def _pytest(project: Path, batches: dict[str, int], *args: str, kind: str = "unchanged") -> str:
    env = {**os.environ, "SLOWDOWN": kind, "BENCH_ROWS": json.dumps(batches), "PYTHONPATH": str(REPO),
           "OMP_NUM_THREADS": "1"}
    env.pop("CI", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-rfE", *args], cwd=project, env=env, capture_output=True, text=True, timeout=1800)
    return done.stdout + done.stderr


def _judged(junit: Path) -> list[tuple[str, str, str, float | None]]:
    """(test, outcome, message, None) per test case of a ``--junitxml`` file, from its pytest
    outcome, as CI sees it: failed by ``stepscope: regression`` is ``regression``, skipped by
    ``stepscope: inconclusive`` (the plugin's default for a test still inconclusive) is
    ``inconclusive``, passed is ``pass``; anything else (an error, another failure or skip, an
    outcome unlike the verdict the plugin recorded in its ``stepscope`` property) is ``other``,
    never a pass. The message is the step-time budget's, or pytest's own for ``other``; a failed
    test of any kind is also counted as ``red`` by the caller (:func:`_red`)."""
    import xml.etree.ElementTree as ET

    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        verdict = json.loads(props.get("stepscope") or "{}")
        trouble = next(iter([*case.iter("skipped"), *case.iter("error"), *case.iter("failure")]), None)
        said = "" if trouble is None else (trouble.get("message") or "").removeprefix("Failed: ")
        if trouble is None:
            outcome = "pass"
        elif trouble.tag == "failure" and said.startswith("stepscope: regression"):
            outcome = "regression"
        elif trouble.tag == "skipped" and said.startswith("stepscope: inconclusive"):
            outcome = "inconclusive"
        else:
            outcome = "other"
        if outcome != "other" and verdict.get("status") == outcome:
            budgets = verdict["budgets"]
            out.append((case.get("name", "?"), outcome, f"{verdict['runs']} run(s): {budgets[0] if budgets else ''}",
                        None))
        else:
            out.append((case.get("name", "?"), "other", f"{trouble.tag if trouble is not None else 'passed'}: {said} "
                        f"(recorded {verdict.get('status')})", None))
    return out


def _red(junit: Path) -> int:
    """The test cases of a ``--junitxml`` file that turn CI red: failed or in error."""
    import xml.etree.ElementTree as ET

    return sum(1 for case in ET.parse(junit).getroot().iter("testcase")
               if next(iter([*case.iter("error"), *case.iter("failure")]), None) is not None)


def _candidates(project: Path, session: int, kind: str) -> Path:
    """The store a judged session's candidate runs go to (``--stepscope-store``): kept with
    ``--keep``, so ``--rejudge`` can judge them again."""
    return project / f"candidates-{session}-{kind}"


def _rejudged(project: Path, session: int, kind: str) -> list[tuple[str, str, str, float | None]]:
    """(test, outcome, message, judged factor) per test of a kept session, judged again with the rule as it is
    now, the plugin's way (:func:`stepscope.commands.compare.gate` with the default budgets, the
    candidate's first run, then one more while the plugin would run the test again,
    :func:`stepscope.pytest_plugin.needs_another_run`, up to its ``1 + reruns`` runs; a rule that
    decides sooner than the recorded one uses fewer runs, one that decides later has only the runs
    the session made); the judged factor is the candidate's step time over the baseline's, in the
    measure judged. Until 2026-12-04 this went on only while grey, where the plugin also re-runs a
    regression: a 4x slowdown judged "cannot tell" on three runs was replayed as caught on one."""
    from stepscope.commands.compare import gate
    from stepscope.pytest_plugin import DEFAULT_RERUNS, needs_another_run
    from stepscope.store.baselines import load_baselines
    from stepscope.store.runs import stored_runs

    store = _candidates(project, session, kind)
    recorded = set(stored_runs(store))
    out = []
    for folder in sorted((project / "perf").iterdir()):
        for test in sorted(load_baselines(folder)):
            runs = [r for r in (test, *(f"{test}..run{n}" for n in range(2, 2 + DEFAULT_RERUNS))) if r in recorded]
            for used in range(1, len(runs) + 1):
                comparison, verdict = gate(f"{folder}::{test}", [f"{store}::{r}" for r in runs[:used]], None, [],
                                           None, None)
                if not needs_another_run(comparison, verdict):
                    break
            step = comparison.metric("step_time")
            budget = next(r.message for r in verdict.results if r.budget.metric == "step_time")
            factor = (step.cand_value or 0) / (step.base_value or 1)
            out.append((test, verdict.status, f"{factor:.2f}x judged, {used} run(s): {budget}", factor))
    return out


def _runs_used(message: str) -> str:
    """The ``N run(s)`` a judged test's message starts with (``?`` for a test not judged)."""
    found = re.search(r"(\d+) run\(s\)", message)
    return found.group(1) if found else "?"


def _unlike_live(kind: str, rejudged: list[tuple[str, str, str, float | None]],
                 live: list[tuple[str, str, str, float | None]]) -> list[str]:
    """Each test whose re-judged outcome or number of runs differs from what the live session's
    ``--junitxml`` recorded: a re-judge with the rule the session ran must reproduce it."""
    from stepscope.store.writer import run_id

    recorded = {run_id(f"test_perf.py::{test}"): (outcome, _runs_used(message)) for test, outcome, message, _ in live}
    out = []
    for test, outcome, message, _ in rejudged:
        now = (outcome, _runs_used(message))
        if recorded.get(test) != now:
            out.append(f"{kind} {test}: live {recorded.get(test)}, re-judged {now}")
    return out


def plugin_part(condition: str, sessions: int, steps: int, batches: dict[str, int] | None, root: Path,
                load: LoadSamples) -> dict[str, Counter[str]]:
    """Save the project's baseline, then judge ``sessions`` sessions of each kind: outcome counts
    per kind (one per test); the message of every outcome that misses a target is printed.
    ``batches`` None: run nothing, judge the sessions a ``--keep`` folder holds again
    (:func:`_rejudged`)."""
    from stepscope.analysis.quantiles import median

    project = root / f"plugin-{condition}"
    if batches is not None:
        project.mkdir()
        (project / "test_perf.py").write_text(textwrap.dedent(PROJECT.format(inp=IN, hidden=HIDDEN, batch=BATCH,
                                                                             steps=steps)))
        (project / "conftest.py").write_text("")
        out = _pytest(project, batches, "--stepscope-save-baseline")
        if "4 passed" not in out:
            raise SystemExit(f"saving the plugin project's baseline failed:\n{out}")
    counts: dict[str, Counter[str]] = {}
    missed: list[str] = []
    differ: list[str] = []
    replayed = 0
    too_loaded: Counter[str] = Counter()
    factors: dict[str, list[float]] = {kind: [] for kind in FACTORS}
    for session in range(sessions):
        for kind in FACTORS:
            load.sample()
            junit = project / f"judged-{session}-{kind}.xml"
            if batches is None:
                judged = _rejudged(project, session, kind)
                if junit.exists():
                    differ += _unlike_live(kind, judged, _judged(junit))
                    replayed += len(judged)
            else:
                _pytest(project, batches, f"--junitxml={junit}",
                        f"--stepscope-store={_candidates(project, session, kind)}", kind=kind)
                judged = _judged(junit) if junit.exists() else [("session", "other", "no --junitxml written", None)]
            counts.setdefault(kind, Counter()).update(outcome for _, outcome, _, _ in judged)
            if batches is None:  # re-judged: the plugin's default turns only a regression red
                counts[kind]["red"] += sum(outcome == "regression" for _, outcome, _, _ in judged)
            else:
                counts[kind]["red"] += _red(junit) if junit.exists() else TESTS_PER_SESSION
            too_loaded[kind] += sum("too loaded to judge" in message for _, _, message, _ in judged)
            factors[kind] += [factor for *_, factor in judged if factor is not None]
            missed += [f"{kind} {outcome} {test}: {message[:300]}" for test, outcome, message, _ in judged
                       if outcome != ("pass" if kind == "unchanged" else "regression")]
    if any(factors.values()):
        print(f"\n{condition}: each kind's judged step time against its baseline's (median over tests): "
              + ", ".join(f"{k} {median(v):.2f}x (range {min(v):.2f}-{max(v):.2f})"
                          for k, v in factors.items() if v))
    if replayed:
        print(f"\n{condition}: re-judged as the live session recorded (outcome and runs used): "
              f"{replayed - len(differ)}/{replayed}" + "".join(f"\n  {line}" for line in differ))
    print(f"\n{condition}: plugin tests judged too loaded to judge (past the load ceiling), per kind: "
          f"{dict(too_loaded) or 'none'}")
    print(f"{condition}: plugin outcomes off target ({len(missed)}):")
    for line in missed:
        print(f"  {line}")
    return counts


def others_part(busy: list[int], runs: int, steps: int, root: Path) -> None:
    """What the rest of the machine's measured CPU use says about a run's CPU time: ``runs``
    unchanged runs (the compare part's, bare steps) with each number of ``busy`` processes of
    ours spinning; per run the others' CPUs (:attr:`~stepscope.analysis.compare.stats.Preemption.others`),
    its median step CPU time over the least of all runs' (its inflation, measured), what the
    per-step preemption rule allows it, and whether the rule before the measure called it busy
    (:data:`~stepscope.analysis.compare.stats.BUSY_LOAD`). Picks
    :data:`~stepscope.analysis.compare.stats.QUIET_OTHERS`: under it, no run may be inflated past
    what its preempted steps allow."""
    from stepscope.analysis.compare.comparison import _preemptions, profiles, side_source
    from stepscope.analysis.compare.stats import BUSY_LOAD, QUIET_OTHERS
    from stepscope.analysis.quantiles import median
    from stepscope.store import open_store

    work = Workload({"unchanged": BATCH})
    work.record(root / "warm-up", "w", "unchanged", steps)
    rows = []
    for n in busy:
        with background_load(n):
            for i in range(runs):
                store = root / f"others-{n}" / f"r{i}"
                work.record(store, "r", "unchanged", steps)
                with open_store(store) as opened:
                    [profile] = profiles([(opened, "r")], side_source([(opened, "r")]))  # type: ignore[list-item]
                [found] = _preemptions([profile])
                assert found is not None and found.others is not None, "no others_cpu_ns recorded"
                cpu = profile.samples["step_time"]
                assert isinstance(cpu, list)
                rows.append((n, found.others, median(cpu), found.inflation, found.preempted_load, os.getloadavg()[0]))
    least = median([r[2] for r in rows if r[0] == min(busy)])
    print(f"\nothers' CPUs vs CPU-time inflation ({runs} runs of {steps} steps each, unchanged code; inflation: a "
          f"run's median step CPU time over the median of the runs with {min(busy)} busy processes, "
          f"{least / 1e6:.3f} ms; allowed: its per-step bound; busy: preempted steps >= {BUSY_LOAD:g}x, the rule "
          "before the measure)")
    for n in busy:
        mine = [r for r in rows if r[0] == n]
        others = sorted(r[1] for r in mine)
        infl = sorted(r[2] / least for r in mine)
        over = [r for r in mine if r[2] / least > (1 + r[3]) * 1.05]
        print(f"  {n} busy: others {others[0]:.2f}-{others[-1]:.2f} CPUs (median {median(others):.2f}); inflation "
              f"{infl[0]:.2f}-{infl[-1]:.2f}x (median {median(infl):.2f}); old rule busy "
              f"{sum(r[4] >= BUSY_LOAD for r in mine)}/{len(mine)}; past allowed +5 %: {len(over)}/{len(mine)}; "
              f"load average {min(r[5] for r in mine):.1f}-{max(r[5] for r in mine):.1f}")
    for limit in sorted({0.1, 0.2, 0.3, QUIET_OTHERS, 0.5, 0.75}):
        under = [r for r in rows if r[1] < limit]
        worst = max((r[2] / least / (1 + r[3]) for r in under), default=float("nan"))
        print(f"  others < {limit:.2f}: {len(under)} runs ({', '.join(f'{sum(r[0] == n for r in under)} at {n} busy' for n in busy)}); "
              f"the most any was inflated past its per-step allowance (over that median): {worst:.2f}x")
    print("  per run (busy, others, inflation, allowed, preempted load): "
          + " ".join(f"{r[0]}/{r[1]:.2f}/{r[2] / least:.2f}/{r[3]:.2f}/{r[4]:.2f}" for r in rows), flush=True)


def _line(kind: str, counts: Counter[str], n: int) -> str:
    caught, grey, ok = counts["regression"], counts["inconclusive"], counts["pass"]
    other = n - caught - grey - ok
    return (f"  {kind:<16} regression {caught:>2}/{n}  inconclusive {grey:>2}/{n}  ok {ok:>2}/{n}"
            + (f"  other {other}" if other else ""))


def _verdict(counts: dict[str, Counter[str]], n: int, red_means: str) -> list[str]:
    """The targets, each met or missed, for one condition; and how often unchanged code turned CI
    red (``red_means`` says what counts: failed tests, or the documented workflow's exit code)."""
    out = []
    false_alarms = counts["unchanged"]["regression"]
    out.append(f"  false alarms {false_alarms}/{n} (target 0): {'met' if false_alarms == 0 else 'MISSED'}"
               f"; unchanged called inconclusive {counts['unchanged']['inconclusive']}/{n}")
    out.append(f"  red CI on unchanged code: {counts['unchanged']['red']}/{n} ({red_means})")
    caught4 = counts["4x"]["regression"]
    out.append(f"  4x caught {caught4}/{n} (target {n}/{n}): {'met' if caught4 == n else 'MISSED'}")
    c13, grey13, ok13 = counts["1.3x"]["regression"], counts["1.3x"]["inconclusive"], counts["1.3x"]["pass"]
    met = ok13 == 0 and c13 + grey13 == n
    out.append(f"  1.3x caught {c13}/{n}, inconclusive {grey13}/{n}, ok {ok13}/{n} (target: >= {0.9 * n:.0f} "
               f"caught, the rest inconclusive, never ok): "
               f"{'met' if met and c13 >= 0.9 * n else 'met only as inconclusive' if met else 'MISSED'}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20, help="pairs per kind and condition (default 20)")
    parser.add_argument("--steps", type=int, default=20, help="training steps per run (default 20)")
    parser.add_argument("--candidate-runs", type=int, default=3,
                        help="runs of each candidate judged together (default 3, as docs/ci.md's workflow)")
    parser.add_argument("--sessions", type=int, default=5,
                        help="plugin sessions per kind and condition, four tests each (default 5: 20 judged tests)")
    parser.add_argument("--plugin-steps", type=int, default=10, help="profiled steps of each plugin test (default 10)")
    parser.add_argument("--part", choices=("cli", "plugin", "all"), default="all")
    parser.add_argument("--conditions", default="quiet,loaded", help="which conditions, in order (default both)")
    parser.add_argument("--load", type=int, default=2, help="busy processes of the loaded condition (default 2)")
    parser.add_argument("--keep", type=Path, help="record into this folder and keep it (default: a temporary one)")
    parser.add_argument("--others", default=None, metavar="N,N,..",
                        help="measure only: --pairs runs with each number of busy processes (e.g. 0,1,2): the rest "
                             "of the machine's CPU use against each run's CPU-time inflation (QUIET_OTHERS)")
    parser.add_argument("--rejudge", type=Path,
                        help="record nothing: judge the compare part's runs that --keep left in this folder again "
                             "(the same --pairs, --candidate-runs and --conditions), with the rule as it is now")
    args = parser.parse_args(argv)
    if args.rejudge is not None:
        for condition in args.conditions.split(","):
            if args.part in ("cli", "all"):
                counts = cli_part(condition, args.pairs, args.steps, args.candidate_runs, None, args.rejudge,
                                  LoadSamples())
                print(f"\ncompare, {condition}, judged again from {args.rejudge} (the load as recorded):")
                print("\n".join([*(_line(kind, counts[kind], args.pairs) for kind in FACTORS),
                                 *_verdict(counts, args.pairs, CLI_RED)]), flush=True)
            if args.part in ("plugin", "all"):
                n = args.sessions * TESTS_PER_SESSION
                counts = plugin_part(condition, args.sessions, args.plugin_steps, None, args.rejudge, LoadSamples())
                print(f"\npytest plugin, {condition}, judged again from {args.rejudge} (the load as recorded):")
                print("\n".join([*(_line(kind, counts[kind], n) for kind in FACTORS), *_verdict(counts, n, PLUGIN_RED)]),
                      flush=True)
        return 0
    os.environ["OMP_NUM_THREADS"] = "1"
    if args.others is not None:
        with contextlib.ExitStack() as kept:
            root = args.keep or Path(kept.enter_context(tempfile.TemporaryDirectory(prefix="bench-gate-")))
            root.mkdir(parents=True, exist_ok=True)
            others_part([int(n) for n in args.others.split(",")], args.pairs, args.steps, root)
        return 0
    print(f"bench_gate: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start; "
          f"{args.pairs} pairs of {args.candidate_runs} candidate runs, {args.steps} steps a run, "
          f"{args.sessions} plugin sessions a kind")
    started_all = time.perf_counter(), time.process_time()
    batches = calibrate(profiled=False) if args.part in ("cli", "all") else None
    plugin_batches = calibrate(profiled=True) if args.part in ("plugin", "all") else None
    with contextlib.ExitStack() as kept:
        root = args.keep or Path(kept.enter_context(tempfile.TemporaryDirectory(prefix="bench-gate-")))
        root.mkdir(parents=True, exist_ok=True)
        for condition in args.conditions.split(","):
            processes = args.load if condition == "loaded" else 0
            with background_load(processes):
                if args.part in ("cli", "all"):
                    load, started = LoadSamples(), (time.perf_counter(), time.process_time())
                    counts = cli_part(condition, args.pairs, args.steps, args.candidate_runs, batches, root, load)
                    print(f"\ncompare, {condition} ({processes} busy processes of ours; {load.text()}; "
                          f"{time.perf_counter() - started[0]:.0f} s wall, {time.process_time() - started[1]:.0f} s "
                          "CPU of this process):")
                    for kind in FACTORS:
                        print(_line(kind, counts[kind], args.pairs))
                    for kind in FACTORS:
                        print(_line(f"before {kind}", counts[f"before:{kind}"], args.pairs))
                    print("\n".join(_verdict(counts, args.pairs, CLI_RED)), flush=True)
                if args.part in ("plugin", "all"):
                    load, started = LoadSamples(), (time.perf_counter(), time.process_time())
                    n = args.sessions * TESTS_PER_SESSION
                    counts = plugin_part(condition, args.sessions, args.plugin_steps, plugin_batches, root, load)
                    print(f"\npytest plugin, {condition} ({processes} busy processes of ours; {load.text()}; "
                          f"{time.perf_counter() - started[0]:.0f} s wall):")
                    for kind in FACTORS:
                        print(_line(kind, counts[kind], n))
                    print("\n".join(_verdict(counts, n, PLUGIN_RED)), flush=True)
    print(f"\ntotal {time.perf_counter() - started_all[0]:.0f} s wall, "
          f"{time.process_time() - started_all[1]:.0f} s CPU of this process")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
