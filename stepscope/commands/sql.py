"""``stepscope sql "SELECT ..." --store DIR``: read-only SQL over the store's views."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stepscope.commands._output import FORMATS, render


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("query", help="one SELECT statement over runs, sources, events, steps, memory, ...")
    parser.add_argument("--store", required=True, type=Path, help="store folder")
    parser.add_argument("--format", choices=FORMATS, default="table")
    parser.add_argument("--max-rows", type=int, default=None, help="stop after this many rows")


def run(args: argparse.Namespace) -> int:
    from stepscope.store import open_store

    with open_store(args.store, read_only_sql=True) as store:
        rows, truncated = store.read_only_query(args.query, max_rows=args.max_rows)
    print(render(rows, args.format))
    if truncated:
        print(f"(stopped at {args.max_rows} rows)", file=sys.stderr)
    return 0
