"""``stepscope demo``: ingest the bundled sample traces into a local store, show what they hold,
and open the dashboard on it (``--no-dashboard``: print only).

Each folder under ``sample_traces/`` is one run (its files are the ranks). Ingest is idempotent,
so running the demo twice reuses the store.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from stepscope.commands._output import to_text
from stepscope.errors import UsageError

if TYPE_CHECKING:
    import pyarrow as pa

    from stepscope.store import Store

SAMPLE_TRACES = Path(__file__).resolve().parents[2] / "sample_traces"

BREAKDOWN_PER_RANK = """
SELECT run, rank, count(*) AS steps, {parts}
FROM breakdown GROUP BY run, rank ORDER BY run, rank
"""


def time_by_category(store: Store, run: str) -> pa.Table | None:
    """Per rank, the run's steps split into disjoint parts (ms): the GPU breakdown when the
    trace has GPU work, else the host breakdown. Every number comes from the analysis layer."""
    from stepscope.analysis import is_absent
    from stepscope.analysis.breakdown import host_breakdown, step_breakdown
    from stepscope.store.catalog import connect

    breakdown = step_breakdown(store, run)
    if is_absent(breakdown):
        breakdown = host_breakdown(store, run)
    if is_absent(breakdown):
        return None
    columns = ["dur_ns", *(c for c in breakdown.column_names if c.endswith("_ns")
                           and c not in ("dur_ns", "start_ns", "end_ns"))]
    parts = ", ".join(f"round(sum({c}) / 1e6, 3) AS {c.removesuffix('_ns')}_ms" for c in columns)
    con = connect()
    con.register("breakdown", breakdown)
    return con.sql(BREAKDOWN_PER_RANK.format(parts=parts)).to_arrow_table()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", type=Path, default=Path(".stepscope-demo"), help="store folder")
    parser.add_argument("--traces", type=Path, default=SAMPLE_TRACES, help="folder of sample runs")
    parser.add_argument("--no-dashboard", action="store_true",
                        help="only print what the store holds; do not start the dashboard")
    from stepscope.commands.dashboard import add_server_arguments

    add_server_arguments(parser)


def sample_runs(traces: Path) -> list[Path]:
    """The run folders under ``traces`` (each holds one run's rank files)."""
    if not traces.is_dir():
        raise UsageError(f"{traces}: no sample traces here (pass --traces DIR)")
    runs = sorted(p for p in traces.iterdir() if p.is_dir())
    if not runs:
        raise UsageError(f"{traces}: no run folders")
    return runs


def run(args: argparse.Namespace) -> int:
    from stepscope.store import open_store
    from stepscope.store.ingest import ingest_paths

    for folder in sample_runs(args.traces):
        report = ingest_paths([folder], args.store, folder.name)
        for line in report.errors:
            print(line)
    with open_store(args.store) as store:
        print("Runs\n")
        print(to_text(store.sql("SELECT run, ranks, world_size, backend, gpu_name, events FROM runs ORDER BY run")))
        for run_name in store.sql("SELECT run FROM runs ORDER BY run")["run"].to_pylist():
            table = time_by_category(store, run_name)
            print(f"\n{run_name}: time by category per rank, summed over profiled steps (ms)\n")
            print(to_text(table) if table is not None else "(no steps in this run)")
            print(f"  details: stepscope summary --run {run_name} --store {args.store}")
    print(f"\nStore: {args.store.resolve()}  (try: stepscope sql \"SELECT * FROM steps\" --store {args.store})")
    if args.no_dashboard:
        return 0
    from stepscope.commands.dashboard import serve

    return serve(args.store, args.host, args.port)
