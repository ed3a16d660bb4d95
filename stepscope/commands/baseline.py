"""``stepscope baseline set NAME RUN [RUN ...] --store DIR [--keep N]`` / ``stepscope baseline
list --store DIR``: add runs to the baseline later comparisons start from (per branch or tag),
which keeps its last N (default 3), in ``<store>/baselines.json``."""

from __future__ import annotations

import argparse
from pathlib import Path

from stepscope.store.baselines import DEFAULT_KEEP
from stepscope.store.location import store_location


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    set_parser = actions.add_parser("set", help="add RUN to baseline NAME (a branch or tag), which keeps its last N runs")
    set_parser.add_argument("name", help="baseline name, e.g. main or release/2.1")
    set_parser.add_argument("run", nargs="+", help="run id in the store (several: runs of the same code, oldest first)")
    set_parser.add_argument("--keep", type=int, default=DEFAULT_KEEP, metavar="N",
                            help=f"runs the baseline keeps, newest last (default {DEFAULT_KEEP}): the spread "
                                 "between them is the noise a change must exceed")
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
    from stepscope.store.baselines import entry_runs, load_baselines, set_baseline

    if args.action == "set":
        runs = [_known_run(args.store, run) for run in args.run]
        for run in runs:
            entry = set_baseline(args.store, args.name, run, reason=args.reason, keep=args.keep)
        print(f"baseline {args.name} -> runs {', '.join(entry['runs'])} ({args.store})")
        return 0
    baselines = load_baselines(args.store)
    if not baselines:
        print(f"no baselines in {args.store} (set one with `stepscope baseline set NAME RUN --store {args.store}`)")
    for name, entry in sorted(baselines.items()):
        reason = f"  ({entry['reason']})" if entry.get("reason") else ""
        print(f"{name}: {', '.join(entry_runs(entry))}  set {entry['set_at']}{reason}")
    return 0
