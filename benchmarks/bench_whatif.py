"""What-if against recorded pairs (issue 21): the replay's prediction beside the step measured.

Usage: ``python benchmarks/bench_whatif.py [--traces DIR] [--record DIR]``

1. **Unchanged replay** (target: within 2% of every measured step): every shared trace with
   steps that ``--traces`` (default ``../shared/traces``) holds among :data:`SHARED`, the
   matched pair ``hta/trace_filter/sampled_rank-0``/``-1``, and the project's multi-rank samples
   (``sample_traces/``). Printed: the worst step's relative error, and the critical path's
   length against the step's span over the ranks.
2. **Recorded pairs** (target: the prediction within 10% of the other run's measured step,
   medians over the profiled steps, warm-up excluded by the profiler's schedule):
   ``gloo-3ranks-late`` with ``rank 2: on time`` against ``gloo-3ranks-even`` (the committed
   samples); with ``--record DIR``, recorded afresh: examples/late_rank_gloo.py (12 profiled
   steps) with a 30 ms sleep against none (``rank 2: on time``), the same with an 8 MB
   all-reduce every step against 16 MB (``communication_transfer*2``), and a 3-stage 1F1B
   pipeline (4 profiled steps) with stage 1 slowed by sleeping (examples/train_pipeline_cpu.py
   ``--slow-stage 1 --slow-kind sleep``) against the balanced one (``rank 1: on time``). The
   sleep stands for a GPU stage on its own device: it delays its neighbours without taking
   their CPU. Stage 1 slowed by extra compute (``--slow-kind compute``, the committed samples'
   kind) is printed too, as the 2-core contention case: its three ranks share two cores, so the
   slow stage's compute also slows the other ranks' own work and gloo transfers (in one
   recording their host work grew 74% and 123%), which the slow run's trace records and no
   replay that makes only rank 1 on time can remove. Each pair prints the prediction's median and mean over the steps
   against the measured run's, the error bar, and the measured run's own step spread (its
   steps' coefficient of variation and their range over their median: a prediction cannot be
   expected closer than the run is to itself).

CPU time (``process_time``) and wall time of each replay are printed with the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from stepscope.analysis.critical_path import step_paths  # noqa: E402
from stepscope.analysis.replay import WhatIf, what_if  # noqa: E402
from stepscope.store import open_store  # noqa: E402
from stepscope.store.ingest import ingest_paths  # noqa: E402

SHARED = ("hta/df_index_resolver/df_index_resolver.json.gz", "hta/trace_diff/control/control.json.gz",
          "hta/trace_diff/test/test.json.gz", "hta/nccl_parser_config/nccl_data.json.gz",
          "hta/negative_queue_length_values_check/rank0.json.gz", "tracelens/mi300/resnet_act_checkpoint.json.gz",
          "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
PAIR = ("hta/trace_filter/sampled_rank-0.json.gz", "hta/trace_filter/sampled_rank-1.json.gz")
SAMPLES = ("gloo-3ranks-late", "gloo-3ranks-even", "ddp-gloo-2ranks", "pp-1f1b-3stages-slow", "pp-1f1b-4stages",
           "pp-gpipe-3stages", "pp-interleaved-2ranks")


def _ingest(store: Path, run: str, files: list[Path]) -> bool:
    report = ingest_paths(files, store, run)
    if not report.ok:
        print(f"  {run}: not ingested ({report.errors})")
    return report.ok


def _unchanged(store: Path, runs: list[str]) -> bool:
    ok = True
    with open_store(store) as s:
        for run in runs:
            c0, w0 = time.process_time(), time.perf_counter()
            result = what_if(s, run)
            paths = step_paths(s, run)
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            if result is None:
                print(f"  {run}: no steps")
                continue
            worst = max(abs(p.unchanged_ns / p.measured_ns - 1) for p in result.steps)
            ratios = [p.length_ns / p.measured_ns for p in paths]
            ok &= worst < 0.02
            print(f"  {run}: {len(result.steps)} steps, measured {result.measured_ns / 1e6:.3f} ms, worst step "
                  f"{100 * worst:.4f}% [{'ok' if worst < 0.02 else 'MISSED'} < 2%]; path / span "
                  f"{min(ratios):.3f}-{max(ratios):.3f}; cpu {cpu:.2f} s, wall {wall:.2f} s")
    return ok


def _pair(store: Path, slow: str, even: str, change: str) -> bool:
    with open_store(store) as s:
        c0, w0 = time.process_time(), time.perf_counter()
        predicted = what_if(s, slow, [change])
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        measured = what_if(s, even)
    if predicted is None or measured is None:
        print(f"  {slow} vs {even}: no steps")
        return False
    return _print_pair(slow, even, change, predicted, measured, cpu, wall)


def _print_pair(slow: str, even: str, change: str, predicted: WhatIf, measured: WhatIf, cpu: float,
                wall: float) -> bool:
    steps = [p.measured_ns for p in measured.steps]
    med_pred = statistics.median(p.predicted_ns for p in predicted.steps)
    med_meas = statistics.median(steps)
    cv = statistics.pstdev(steps) / statistics.fmean(steps)
    spread = (max(steps) - min(steps)) / med_meas
    ratio = med_pred / med_meas
    ok = abs(ratio - 1) <= 0.10
    print(f"  {slow} + '{change}' vs {even}: predicted median {med_pred / 1e6:.3f} ms "
          f"± {predicted.error_ns / 1e6:.4f} ms (slow run measured {statistics.median(p.measured_ns for p in predicted.steps) / 1e6:.3f} ms), "
          f"measured median {med_meas / 1e6:.3f} ms: ratio {ratio:.3f} [{'ok' if ok else 'MISSED'} within 10%]; "
          f"means {predicted.predicted_ns / 1e6:.3f} / {measured.measured_ns / 1e6:.3f} ms = "
          f"{predicted.predicted_ns / measured.measured_ns:.3f}; the measured run's own steps: CV {100 * cv:.0f}%, "
          f"range {100 * spread:.0f}% of their median; cpu {cpu:.2f} s, wall {wall:.2f} s")
    for p in predicted.steps:
        print(f"      {slow} step {p.step}: measured {p.measured_ns / 1e6:.3f} ms -> predicted {p.predicted_ns / 1e6:.3f} ms")
    print(f"      {even} steps: " + ", ".join(f"{p.step}: {p.measured_ns / 1e6:.3f}" for p in measured.steps))
    return ok


def _record(folder: Path) -> Path:
    """Record the fresh pairs into ``folder/store`` (kept when already there: record once, rerun the replays)."""
    store = folder / "store"
    if (folder / "recorded").exists():
        return store
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    py = sys.executable
    torchrun = str(Path(py).with_name("torchrun"))
    late = [py, "examples/late_rank_gloo.py", "--store", str(store), "--steps", "14"]
    pipe = [torchrun, "--standalone", "--nproc-per-node", "3", "examples/train_pipeline_cpu.py", "--store", str(store),
            "--schedule", "1f1b", "--microbatches", "4", "--steps", "6", "--wait", "1", "--warmup", "1", "--active", "4"]
    commands = [
        [*late, "--run-name", "rec-late", "--sleep-ms", "30"],
        [*late, "--run-name", "rec-even", "--sleep-ms", "0"],
        [*late, "--run-name", "rec-comm-1x", "--sleep-ms", "0", "--comm-mb", "8"],
        [*late, "--run-name", "rec-comm-2x", "--sleep-ms", "0", "--comm-mb", "16"],
        [*pipe, "--run-name", "rec-pp-slow", "--slow-stage", "1"],
        [*pipe, "--run-name", "rec-pp-sleep", "--slow-stage", "1", "--slow-kind", "sleep"],
        [*pipe, "--run-name", "rec-pp-balanced"],
    ]
    for command in commands:
        subprocess.run(command, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
    (folder / "recorded").touch()
    return store


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=REPO.parent / "shared" / "traces")
    parser.add_argument("--record", type=Path, default=None, help="record fresh pairs with the examples here")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} (1 min), {os.cpu_count()} CPUs")
    held: list[bool] = []
    with tempfile.TemporaryDirectory(prefix="bench-whatif-") as tmp:
        store = Path(tmp) / "store"
        print("1. unchanged replay (target: every step within 2%)")
        runs = []
        for relative in SHARED:
            if (args.traces / relative).is_file() and _ingest(store, relative.replace("/", "_"), [args.traces / relative]):
                runs.append(relative.replace("/", "_"))
        if all((args.traces / p).is_file() for p in PAIR) and _ingest(store, "sampled-pair", [args.traces / p for p in PAIR]):
            runs.append("sampled-pair")
        for name in SAMPLES:
            if _ingest(store, name, sorted((REPO / "sample_traces" / name).glob("rank*.pt.trace.json.gz"))):
                runs.append(name)
        held.append(_unchanged(store, runs))
        print("2. recorded pairs (target: within 10% of the other run's measured step)")
        held.append(_pair(store, "gloo-3ranks-late", "gloo-3ranks-even", "rank 2: on time"))
        if args.record is not None:
            recorded = _record(args.record)
            held.append(_pair(recorded, "rec-late", "rec-even", "rank 2: on time"))
            held.append(_pair(recorded, "rec-comm-1x", "rec-comm-2x", "communication_transfer*2"))
            held.append(_pair(recorded, "rec-pp-sleep", "rec-pp-balanced", "rank 1: on time"))
            print("  the 2-core contention case (stage 1 slowed by compute that the other ranks' CPU shares):")
            held.append(_pair(recorded, "rec-pp-slow", "rec-pp-balanced", "rank 1: on time"))
        else:
            print("  (no --record: the fresh gloo and pipeline pairs were not recorded; no balanced 3-stage 1F1B "
                  "sample is committed)")
    print(f"targets held: {sum(held)} of {len(held)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
