"""``stepscope demo``: ingest the bundled sample traces into a local store, print each sample
run's verdict (the first screen of ``stepscope summary``) and open the dashboard on it
(``--no-dashboard``: print only).

Each folder under ``sample_traces/`` is one run (its files are the ranks). Ingest is idempotent,
so running the demo twice reuses the store.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from stepscope.errors import UsageError

SAMPLE_TRACES = Path(__file__).resolve().parents[2] / "sample_traces"


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
    from stepscope.analysis.summary import build_summary
    from stepscope.commands.summary import first_screen
    from stepscope.render.table import terminal_width
    from stepscope.store import open_store
    from stepscope.store.ingest import ingest_paths

    for folder in sample_runs(args.traces):
        report = ingest_paths([folder], args.store, folder.name)
        for line in report.errors:
            print(line)
    with open_store(args.store) as store:
        for run_id in store.sql("SELECT run FROM runs ORDER BY run")["run"].to_pylist():
            print(first_screen(build_summary(store, run_id), terminal_width()))
            print(f"  details: stepscope summary --run {run_id} --store {args.store} --section NAME or --verbose\n")
    print(f"Store: {args.store.resolve()}  (try: stepscope sql \"SELECT * FROM steps\" --store {args.store})")
    if args.no_dashboard:
        return 0
    from stepscope.commands.dashboard import serve

    return serve(args.store, args.host, args.port)
