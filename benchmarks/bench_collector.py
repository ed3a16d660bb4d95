"""Overhead of the collector on the CPU example: no profiler vs bare torch.profiler vs stepscope.

Why: a profiler people leave on must cost almost nothing. Issue targets, on the CPU example
(examples/toy_transformer.py, one thread):

- during active (recorded) steps, stepscope.profile within 3% of bare torch.profiler with the
  same schedule and flags: median (c) / median (b) <= 1.03;
- on steps outside the active window, stepscope.profile within 1% of no profiling at all:
  median (c) / median (a) <= 1.01. "Outside" is every step not in warmup or active, including
  the steps right after the window, during which stepscope exports and converts the trace.

Method, in one process: warm up first (a process's first steps are several times slower), then
run rounds; each round runs one session of each mode in shuffled order, so that load drifting
on a shared machine hits all three alike. A session is wait + warmup + active + after steps with
the same schedule; (b) has no on_trace_ready (the trace is simply dropped: the bare cost), (c)
stores every trace. A step's time is measured around ``train_step`` and ``prof.step()``.

Run: python benchmarks/bench_collector.py [--rounds N] [--wait W] [--active A] [--after P]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))

import torch  # noqa: E402
from torch.profiler import ProfilerAction  # noqa: E402

import stepscope  # noqa: E402
from stepscope.collector.options import RECORDING, Recording, Schedule, profiler_kwargs  # noqa: E402
from toy_transformer import ToyConfig, build, synthetic_batch, train_step  # noqa: E402

WARMUP_STEPS = 30
ACTIVE_TARGET = 1.03
OUTSIDE_TARGET = 1.01


class NoProfiler:
    """Mode (a): the loop as the user wrote it."""

    def step(self) -> None:
        return None


def session(mode: str, schedule: Schedule, steps: int, store: Path, index: int,
            model: Any, optimizer: Any, cfg: ToyConfig, data: torch.Generator
            ) -> dict[str, list[float]]:
    """One profiled (or not) stretch of ``steps`` training steps.

    Returns per-step series in seconds: ``wall`` (the targets' measure), ``cpu`` (CPU time of
    the training thread: blind to waiting for the GIL, but not blurred by other processes on a
    shared machine) and ``hook`` (wall time inside ``prof.step()`` alone).
    """
    manager: AbstractContextManager[Any]
    if mode == "a":
        manager = nullcontext(NoProfiler())
    elif mode == "b":
        manager = torch.profiler.profile(**profiler_kwargs(schedule, Recording()))
    else:
        manager = stepscope.profile(store=store, run=f"bench-{index}", wait=schedule.wait,
                                    warmup=schedule.warmup, active=schedule.active, repeat=1,
                                    record_shapes=True, profile_memory=True, strict=True)
    series: dict[str, list[float]] = {"wall": [], "cpu": [], "hook": []}
    with manager as prof:
        for _ in range(steps):
            batch = synthetic_batch(cfg, data)
            start, cpu_start = time.perf_counter(), time.thread_time()
            train_step(model, optimizer, batch)
            hook = time.perf_counter()
            prof.step()
            end, cpu_end = time.perf_counter(), time.thread_time()
            series["wall"].append(end - start)
            series["cpu"].append(cpu_end - cpu_start)
            series["hook"].append(end - hook)
    return series


def ratio_line(name: str, num: list[float], den: list[float], target: float | None,
               stat: Callable[[list[float]], float] = statistics.median) -> str:
    ratio = stat(num) / stat(den)
    verdict = "" if target is None else ("  meets target" if ratio <= target else "  MISSES target")
    limit = "" if target is None else f" (target <= {target:.2f})"
    return f"{name:<50} {ratio:7.4f}{limit}{verdict}"


def p10(values: list[float]) -> float:
    """10th percentile: the least disturbed steps, for a machine shared with other work."""
    return statistics.quantiles(values, n=10)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--wait", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--active", type=int, default=3)
    parser.add_argument("--after", type=int, default=10,
                        help="steps after the active window (where traces are written)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(1)
    cfg = ToyConfig()
    model, optimizer = build(cfg)
    data = torch.Generator().manual_seed(1)
    schedule = Schedule(wait=args.wait, warmup=args.warmup, active=args.active, repeat=1)
    steps = args.wait + args.warmup + args.active + args.after
    action = schedule.torch_schedule()
    active = [s for s in range(steps) if action(s) in RECORDING]
    window = [s for s in range(steps) if action(s) is not ProfilerAction.NONE]
    outside = [s for s in range(steps) if s not in window]
    before = [s for s in outside if s < window[0]]
    after = [s for s in outside if s > window[-1]]

    rng = random.Random(args.seed)
    runs: dict[str, list[dict[str, list[float]]]] = {"a": [], "b": [], "c": []}
    with tempfile.TemporaryDirectory(prefix="bench-collector-") as tmp:
        store = Path(tmp) / "store"
        for _ in range(WARMUP_STEPS // steps + 1):  # warm the process, the profiler and the writer
            for mode in "abc":
                session(mode, schedule, steps, store, -1, model, optimizer, cfg, data)
        for index in range(args.rounds):
            modes = list("abc")
            rng.shuffle(modes)
            for mode in modes:
                runs[mode].append(session(mode, schedule, steps, store, index, model, optimizer,
                                          cfg, data))

    def pick(mode: str, which: list[int], measure: str = "wall") -> list[float]:
        return [run[measure][s] for run in runs[mode] for s in which]

    print(f"torch {torch.__version__}, 1 thread, {args.rounds} rounds x {steps} steps per mode; "
          f"schedule wait={args.wait} warmup={args.warmup} active={args.active}, "
          f"{args.after} steps after the window\n")
    groups: list[tuple[str, list[int]]] = [("active steps", active), ("outside the window", outside),
                                           ("  before the window", before),
                                           ("  after the window", after)]
    for measure in ("wall", "cpu"):
        print(f"{'median step ' + measure + ' time (ms)':<28} {'(a) none':>10} {'(b) torch':>10} "
              f"{'(c) stepscope':>14}")
        for label, which in groups:
            row = [statistics.median(pick(m, which, measure)) * 1e3 for m in "abc"]
            print(f"{label:<28} {row[0]:10.3f} {row[1]:10.3f} {row[2]:14.3f}")
        print()
    blocks: list[tuple[str, str, Callable[[list[float]], float], bool]] = [
        ("median wall time (the targets)", "wall", statistics.median, True),
        ("10th percentile of wall time (least disturbed steps)", "wall", p10, False),
        ("median CPU time of the training thread (robust to other processes, blind to GIL "
         "waits)", "cpu", statistics.median, False),
    ]
    for title, measure, stat, targets in blocks:
        print(f"ratios of {title}")
        print(ratio_line("(c)/(b) active steps", pick("c", active, measure),
                         pick("b", active, measure), ACTIVE_TARGET if targets else None, stat))
        print(ratio_line("(c)/(a) outside the active window", pick("c", outside, measure),
                         pick("a", outside, measure), OUTSIDE_TARGET if targets else None, stat))
        for label, which in (("  (c)/(a) before the window", before),
                             ("  (c)/(a) after the window (trace being written)", after)):
            print(ratio_line(label, pick("c", which, measure), pick("a", which, measure), None,
                             stat))
        print(ratio_line("(b)/(a) active steps (torch.profiler's own cost)",
                         pick("b", active, measure), pick("a", active, measure), None, stat))
        if stat is statistics.median:
            for mode in "cb":
                print(ratio_line(f"({mode})/(a) first step after the window",
                                 pick(mode, after[:1], measure), pick("a", after[:1], measure),
                                 None, stat))
        print()
    hooks_c = statistics.median(pick("c", outside, "hook"))
    hooks_b = statistics.median(pick("b", outside, "hook"))
    print(f"prof.step() itself outside the window, median: stepscope {hooks_c * 1e6:.1f} us, "
          f"torch.profiler {hooks_b * 1e6:.1f} us; stepscope's is "
          f"{hooks_c / statistics.median(pick('a', outside)):.4%} of a step of (a)")


if __name__ == "__main__":
    main()
