"""The CI gate on a shared, noisy runner: false alarms on unchanged code, detection of a known
slowdown, with a background load and without (issue 25).

Targets, with the load and without: 0 false alarms in 20 unchanged pairs; a 4x slowdown caught
20/20; a 1.3x slowdown caught at least 18/20 or declared inconclusive, never passed as "ok". The
same for the pytest plugin on a project of four tests (two sharing a marker's baseline folder,
one parametrised).

Method. The workload is a small MLP trained on one thread; a slowdown of 1.3x trains on a batch
1.3 times as large, 4x on one 4 times as large: the same ops, the same calls per step (the
comparability checks pass, as they do for a model made wider), the work, and so the training
thread's CPU time, about that factor larger (the measured factor is printed). Each condition (``quiet``,
then ``loaded``: two processes spinning on the CPU for the whole condition) records, in one
process, a stream of unchanged runs and, interleaved with it, one 1.3x and one 4x run per pair,
each a ``stepscope.profile`` run of ``--steps`` steps. Pair i's baseline is the three unchanged
runs before its candidates (what ``baseline set`` keeps after three pushes to main); its
candidates are the next unchanged run, the 1.3x run and the 4x run. Each is judged with the
default budgets (``step_time:+10%``, ``peak_memory:+10%``) exactly as ``stepscope compare``
judges (:func:`stepscope.analysis.compare.comparison.compare_sides` and ``verdict``).

For the record, the same pairs are also judged by the gate as it was before (wall time, one
baseline run against one candidate, Mann-Whitney U over the steps of each at alpha 0.05, the same
+10 % threshold and 0.5 ms floor), printed as ``before``.

The plugin part writes the four-test project, saves its baseline (three runs of each test), then
runs ``--sessions`` plain pytest sessions per kind (unchanged, every test 1.3x, every test 4x),
each judging the four tests (re-running grey ones, as the plugin does); a test is counted as
caught when it fails on ``regression``, inconclusive when it fails on ``inconclusive``.

The machine is shared with other work as well (other jobs' load comes and goes): the "quiet"
condition is only free of this benchmark's own load.

Run: python benchmarks/bench_gate.py [--pairs 20] [--steps 12] [--sessions 5] [--part cli|plugin|all]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
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

BATCH = 320
"""Rows of the unchanged code's batch (about 3 ms of CPU per step on this machine, quiet)."""
FAST = {"profile_memory": False, "record_shapes": False}
"""The runs record no memory and no shapes: ~6 s less per run on a loaded 2-core machine, for a
benchmark of the step-time gate (the peak-memory budget abstains)."""
FACTORS = {"unchanged": 1.0, "1.3x": 1.3, "4x": 4.0}
BASELINE_RUNS = 3
TESTS_PER_SESSION = 4


def _spin() -> None:  # pragma: no cover - a background load process
    while True:
        pass


@contextmanager
def background_load(processes: int) -> Iterator[None]:
    """``processes`` processes busy on the CPU while the block runs (none for 0)."""
    workers = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(processes)]
    for w in workers:
        w.start()
    try:
        yield
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.join()


class Workload:
    """The MLP and its data, built once; ``record`` stores one run of ``factor`` times the work."""

    def __init__(self) -> None:
        import torch

        torch.set_num_threads(1)
        torch.manual_seed(0)
        self.torch = torch
        self.model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
        self.data = {f: torch.randn(round(BATCH * f), 128) for f in FACTORS.values()}

    def record(self, store: Path, run: str, factor: float, steps: int) -> None:
        import stepscope

        data = self.data[factor]
        with stepscope.profile(store=store, run=run, wait=0, warmup=1, active=1, convert="thread", **FAST) as prof:
            for _ in range(steps):
                self.model(data).sum().backward()
                prof.step()


def _before(base: object, cand: object) -> str:
    """The gate before issue 25 on one baseline run and one candidate: wall time, Mann-Whitney U
    over the steps of one run (regression when over +10 % and the 0.5 ms floor and p < 0.05)."""
    from stepscope.analysis.compare.stats import mann_whitney_greater
    from stepscope.analysis.quantiles import median

    b, c = base, cand
    b_med, c_med = median(b), median(c)  # type: ignore[arg-type]
    if c_med - b_med <= 0.10 * b_med or c_med - b_med <= 500_000:
        return "pass"
    return "regression" if mann_whitney_greater(b, c).p_value < 0.05 else "pass"  # type: ignore[arg-type]


def cli_part(condition: str, pairs: int, steps: int, root: Path) -> dict[str, Counter[str]]:
    """Record and judge ``pairs`` pairs of each kind under the current load; outcome counts per
    kind, and per kind with ``before:`` for the old gate."""
    from stepscope.analysis.compare import DEFAULT_BUDGETS, parse_budgets, verdict
    from stepscope.analysis.compare.budgets import floors
    from stepscope.analysis.compare.comparison import compare_profiles, profiles, side_source
    from stepscope.analysis.quantiles import median
    from stepscope.store import open_store

    work = Workload()
    work.record(root / "warm-up", "w", 1.0, steps)  # a process's first profile pays one-time costs
    unchanged = []

    def store(run: str) -> Path:
        """A store per run: a query's cost grows with the runs of its store, not the point here."""
        return root / f"cli-{condition}" / run

    for i in range(BASELINE_RUNS + pairs):
        unchanged.append(f"u{i}")
        work.record(store(f"u{i}"), f"u{i}", 1.0, steps)
        if i >= BASELINE_RUNS:
            for kind in ("1.3x", "4x"):
                work.record(store(f"{kind}-{i}"), f"{kind}-{i}", FACTORS[kind], steps)
    counts: dict[str, Counter[str]] = {}
    budgets, table = parse_budgets(list(DEFAULT_BUDGETS)), floors()
    reasons: Counter[str] = Counter()
    runs = [r for r in unchanged] + [f"{k}-{i}" for i in range(BASELINE_RUNS, BASELINE_RUNS + pairs)
                                     for k in ("1.3x", "4x")]
    with contextlib.ExitStack() as stack:
        opened = {r: stack.enter_context(open_store(store(r))) for r in runs}
        source = side_source([(opened[r], r) for r in runs])
        # each run gathered once (what compare_sides does per comparison), then judged per pair
        profile = dict(zip(runs, profiles([(opened[r], r) for r in runs], source)))
        for i in range(BASELINE_RUNS, BASELINE_RUNS + pairs):
            base = [profile[r] for r in unchanged[i - BASELINE_RUNS:i]]
            for kind, run in (("unchanged", f"u{i}"), ("1.3x", f"1.3x-{i}"), ("4x", f"4x-{i}")):
                comparison = compare_profiles(base, [profile[run]])
                result = verdict(comparison, budgets, table)
                counts.setdefault(kind, Counter())[result.status] += 1
                if result.status != "pass":
                    reasons[f"{kind} {result.status}: {result.reasons[0][:160]}"] += 1
                old = _before(_walls(opened[unchanged[i - 1]], unchanged[i - 1]), _walls(opened[run], run))
                counts.setdefault(f"before:{kind}", Counter())[old] += 1
        cpu = {kind: median([median(profile[r].samples["step_time"]) for r in runs if r.startswith(prefix)])
               for kind, prefix in (("unchanged", "u"), ("1.3x", "1.3x-"), ("4x", "4x-"))}
    print(f"\n{condition}: step time from {source}; median CPU time per step: "
          + ", ".join(f"{k} {v / 1e6:.2f} ms ({v / cpu['unchanged']:.2f}x)" for k, v in cpu.items()))
    for reason, n in sorted(reasons.items()):
        print(f"  {n} x {reason}")
    return counts


def _walls(store: object, run: str) -> list[float]:
    rows = store.sql("SELECT wall_ns FROM step_times WHERE run = $run ORDER BY step", {"run": run})  # type: ignore[attr-defined]
    return [float(v) for v in rows.column("wall_ns").to_pylist()]


PROJECT = '''
import os, pytest, torch

model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
data = torch.randn(4 * {batch}, 128)


def train(profile):
    batch = data[: round({batch} * float(os.environ.get("SLOWDOWN", "1")))]
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


def _pytest(project: Path, *args: str, slowdown: float = 1.0) -> str:
    env = {**os.environ, "SLOWDOWN": str(slowdown), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("CI", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", *args],
                          cwd=project, env=env, capture_output=True, text=True, timeout=1800)
    return done.stdout + done.stderr


def plugin_part(condition: str, sessions: int, steps: int, root: Path) -> dict[str, Counter[str]]:
    """Save the project's baseline, then judge ``sessions`` sessions of each kind: outcome counts
    per kind (one per test)."""
    project = root / f"plugin-{condition}"
    project.mkdir()
    (project / "test_perf.py").write_text(textwrap.dedent(PROJECT.format(batch=BATCH, steps=steps)))
    (project / "conftest.py").write_text("")
    out = _pytest(project, "--stepscope-save-baseline")
    if "4 passed" not in out:
        raise SystemExit(f"saving the plugin project's baseline failed:\n{out}")
    counts: dict[str, Counter[str]] = {}
    for _ in range(sessions):
        for kind, factor in FACTORS.items():
            out = _pytest(project, slowdown=factor)
            found = Counter()
            for line in out.splitlines():
                if line.startswith("FAILED "):
                    found["regression" if "stepscope: regression" in line else
                          "inconclusive" if "stepscope: inconclusive" in line else "error"] += 1
            found["pass"] = TESTS_PER_SESSION - sum(found.values())
            counts.setdefault(kind, Counter()).update(found)
    return counts


def _line(kind: str, counts: Counter[str], n: int) -> str:
    caught, grey, ok = counts["regression"], counts["inconclusive"], counts["pass"]
    other = n - caught - grey - ok
    return (f"  {kind:<10} regression {caught:>2}/{n}  inconclusive {grey:>2}/{n}  ok {ok:>2}/{n}"
            + (f"  other {other}" if other else ""))


def _verdict(counts: dict[str, Counter[str]], n: int) -> list[str]:
    """The targets, each met or missed, for one condition."""
    out = []
    false_alarms = counts["unchanged"]["regression"]
    out.append(f"  false alarms {false_alarms}/{n} (target 0): {'met' if false_alarms == 0 else 'MISSED'}")
    caught4 = counts["4x"]["regression"]
    out.append(f"  4x caught {caught4}/{n} (target {n}/{n}): {'met' if caught4 == n else 'MISSED'}")
    c13, ok13 = counts["1.3x"]["regression"], counts["1.3x"]["pass"]
    met = ok13 == 0 and (c13 >= 0.9 * n or counts["1.3x"]["inconclusive"] + c13 == n)
    out.append(f"  1.3x caught {c13}/{n}, inconclusive {counts['1.3x']['inconclusive']}/{n}, ok {ok13}/{n} "
               f"(target: >= 90% caught or else inconclusive, never ok): {'met' if met else 'MISSED'}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20, help="pairs per kind and condition (default 20)")
    parser.add_argument("--steps", type=int, default=12, help="training steps per run (default 12)")
    parser.add_argument("--sessions", type=int, default=5,
                        help="plugin sessions per kind and condition, four tests each (default 5: 20 judged tests)")
    parser.add_argument("--part", choices=("cli", "plugin", "all"), default="all")
    parser.add_argument("--load", type=int, default=2, help="busy processes of the loaded condition (default 2)")
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    print(f"bench_gate: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start; "
          f"{args.pairs} pairs, {args.steps} steps a run, {args.sessions} plugin sessions a kind")
    with tempfile.TemporaryDirectory(prefix="bench-gate-") as tmp:
        root = Path(tmp)
        for condition, load in (("quiet", 0), ("loaded", args.load)):
            with background_load(load):
                started = time.perf_counter()
                if args.part in ("cli", "all"):
                    counts = cli_part(condition, args.pairs, args.steps, root)
                    print(f"\ncompare, {condition} ({load} busy processes; load average "
                          f"{os.getloadavg()[0]:.1f}; {time.perf_counter() - started:.0f} s):")
                    for kind in FACTORS:
                        print(_line(kind, counts[kind], args.pairs))
                    for kind in FACTORS:
                        print(_line(f"before {kind}", counts[f"before:{kind}"], args.pairs).replace(
                            "inconclusive  0", "inconclusive  -"))
                    print("\n".join(_verdict(counts, args.pairs)))
                started = time.perf_counter()
                if args.part in ("plugin", "all"):
                    n = args.sessions * TESTS_PER_SESSION
                    counts = plugin_part(condition, args.sessions, args.steps, root)
                    print(f"\npytest plugin, {condition} ({load} busy processes; load average "
                          f"{os.getloadavg()[0]:.1f}; {time.perf_counter() - started:.0f} s):")
                    for kind in FACTORS:
                        print(_line(kind, counts[kind], n))
                    print("\n".join(_verdict(counts, n)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
