"""``stepscope ingest PATH... --store DIR|URL [--run NAME] [--rank N] [--jobs N] [--on-conflict session|refuse]
[--engine local|ray [--ray-address ADDR]]``:
files given together are one run's ranks."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stepscope.errors import TraceFormatError
from stepscope.store.location import store_location


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="trace files or folders holding them")
    parser.add_argument("--store", required=True, type=store_location, help="store folder (created if missing) or URL (s3://bucket/prefix)")
    parser.add_argument("--run", help="run name (default: the folder that holds the files)")
    parser.add_argument("--rank", type=int, metavar="N",
                        help="the rank of the files given (default: a trace's distributedInfo, else the "
                             "file name, rank-3, else its position); memory snapshot pickles take it too")
    parser.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", help="tag the run")
    parser.add_argument("--jobs", type=int, default=None, metavar="N",
                        help="convert N files at once in worker processes (default: the machine's cores; "
                             "a batch expected to convert in under 2 s, one process)")
    parser.add_argument("--on-conflict", choices=("session", "refuse"), default="session",
                        help="another recording of a rank the run holds, or a trace of another job than "
                             "the run's ranks (world size, device, recorded over a day apart): store it as "
                             "a run of its own (session, the default) or refuse it")
    parser.add_argument("--memory-limit", metavar="SIZE",
                        help="DuckDB memory per conversion, e.g. 512MB (default: "
                             "$STEPSCOPE_INGEST_MEMORY_LIMIT or 128MB); a bigger trace spills to disk")
    parser.add_argument("--engine", choices=("local", "ray"), default="local",
                        help="convert in worker processes of this machine (local, the default) or in one "
                             "Ray task per file (ray: pip install 'stepscope[ray]')")
    parser.add_argument("--ray-address", metavar="ADDR",
                        help="with --engine ray: the cluster to join (ray.init(address=ADDR): auto, "
                             "ray://head:10001); default: a local cluster for this batch")
    parser.add_argument("--quiet", action="store_true", help="print only errors")


def _tags(pairs: list[str]) -> dict[str, str]:
    from stepscope.errors import UsageError

    tags = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--tag {pair!r}: expected KEY=VALUE")
        tags[key] = value
    return tags


def run(args: argparse.Namespace) -> int:
    from stepscope.errors import UsageError
    from stepscope.store.ingest import IngestedTrace, ingest_paths

    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: give at least 1")
    if args.rank is not None and args.rank < 0:
        raise UsageError(f"--rank {args.rank}: give 0 or more")

    bar = None

    def selected(files: list[Path]) -> None:
        nonlocal bar
        if not args.quiet and sys.stderr.isatty() and len(files) > 1:
            from tqdm import tqdm

            bar = tqdm(total=len(files), unit="file", desc="ingest", file=sys.stderr)

    def converted(_file: Path) -> None:  # the bar follows conversions (Ray tasks as they end)
        if bar is not None:
            bar.update(1)

    def done(outcome: IngestedTrace | str) -> None:
        if isinstance(outcome, str):
            (bar.write if bar is not None else print)(outcome, file=sys.stderr)
            return
        write = bar.write if bar is not None else print
        if not args.quiet:
            verb = (f"same trace as {outcome.same_as}, already stored, skipped" if outcome.same_as
                    else "already stored, skipped" if outcome.skipped else f"{outcome.events:,} events")
            line = f"{outcome.path}: run {outcome.run} rank {outcome.rank} (rank from {outcome.rank_from}): {verb}"
            write(line + (f"; {outcome.note}" if outcome.note else ""))
        elif outcome.note:  # said even with --quiet: the trace is not in the run asked for
            write(f"{outcome.path}: {outcome.note}")

    report = ingest_paths(args.paths, args.store, args.run, tags=_tags(args.tag),
                          jobs=args.jobs, on_conflict=args.on_conflict,
                          memory_limit=args.memory_limit, engine=args.engine, ray_address=args.ray_address,
                          rank=args.rank,
                          on_selected=selected, on_converted=converted, on_done=done)
    if bar is not None:
        bar.close()
    if not args.quiet:
        stored = sum(not t.skipped for t in report.stored)
        print(f"run {report.run}: {stored} stored, {len(report.stored) - stored} skipped, "
              f"{len(report.errors)} refused -> {args.store}")
    return TraceFormatError.exit_code if report.errors else 0
