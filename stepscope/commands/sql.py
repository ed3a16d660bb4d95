"""``stepscope sql "SELECT ..." --store DIR``: read-only SQL over the store's views.

The query runs in the store's sandbox (only the store's Parquet parts are readable), under a time
limit (``--timeout``, 60 s by default) and DuckDB's memory limit (``--memory-limit``, else
``$STEPSCOPE_MEMORY_LIMIT``, else half of RAM); a query that exceeds either stops with one line
and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stepscope.commands._output import FORMATS, render
from stepscope.store.location import store_location

DEFAULT_TIMEOUT_S = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("query", help="one SELECT statement over runs, sources, events, steps, memory, ...")
    parser.add_argument("--store", required=True, type=store_location, help="store folder or URL (s3://bucket/prefix)")
    parser.add_argument("--format", choices=FORMATS, default="table")
    parser.add_argument("--max-rows", type=int, default=None, help="stop after this many rows")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help=f"stop the query after this long (default {DEFAULT_TIMEOUT_S:g}; 0: no limit)")
    parser.add_argument("--memory-limit", metavar="SIZE",
                        help="DuckDB memory limit, e.g. 8GB or 40%% (default $STEPSCOPE_MEMORY_LIMIT, else 50%%)")


def run(args: argparse.Namespace) -> int:
    from stepscope.store import open_store

    with open_store(args.store, read_only_sql=True, memory_limit=args.memory_limit) as store:
        rows, truncated = store.read_only_query(args.query, max_rows=args.max_rows,
                                                timeout_s=args.timeout or None)
    print(render(rows, args.format))
    if truncated:
        print(f"(stopped at {args.max_rows} rows)", file=sys.stderr)
    return 0
