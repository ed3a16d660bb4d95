"""``stepscope baseline set NAME RUN --store DIR`` / ``stepscope baseline list --store DIR``:
name the run later comparisons start from (per branch or tag), in ``<store>/baselines.json``."""

from __future__ import annotations

import argparse
from pathlib import Path
from stepscope.store.location import store_location


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    set_parser = actions.add_parser("set", help="name RUN as baseline NAME (a branch or tag)")
    set_parser.add_argument("name", help="baseline name, e.g. main or release/2.1")
    set_parser.add_argument("run", help="run id in the store")
    set_parser.add_argument("--store", required=True, type=store_location, help="store folder or URL (s3://bucket/prefix)")
    set_parser.add_argument("--reason", help="why this run (kept in the history)")
    list_parser = actions.add_parser("list", help="show the baselines and their runs")
    list_parser.add_argument("--store", required=True, type=store_location, help="store folder or URL (s3://bucket/prefix)")


def _known_run(store: Path, run: str) -> str:
    from stepscope.errors import UsageError
    from stepscope.store.runs import stored_runs
    from stepscope.store.writer import run_id

    runs = stored_runs(store)
    if run_id(run) not in runs:
        raise UsageError(f"no run {run!r} in store {store} (runs: {', '.join(runs) or 'none'})")
    return run_id(run)


def run(args: argparse.Namespace) -> int:
    from stepscope.store.baselines import load_baselines, set_baseline

    if args.action == "set":
        entry = set_baseline(args.store, args.name, _known_run(args.store, args.run), reason=args.reason)
        print(f"baseline {args.name} -> run {entry['run']} ({args.store})")
        return 0
    baselines = load_baselines(args.store)
    if not baselines:
        print(f"no baselines in {args.store} (set one with `stepscope baseline set NAME RUN --store {args.store}`)")
    for name, entry in sorted(baselines.items()):
        reason = f"  ({entry['reason']})" if entry.get("reason") else ""
        print(f"{name}: {entry['run']}  set {entry['set_at']}{reason}")
    return 0
