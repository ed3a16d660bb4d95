"""``stepscope runs --store DIR``: the runs in a store, one line each."""

from __future__ import annotations

import argparse
from pathlib import Path

from stepscope.commands._output import FORMATS, render

RUNS_QUERY = """
SELECT run, name, ranks, world_size, backend, gpu_name, events,
       strftime(created_at, '%Y-%m-%d %H:%M:%S') AS created_utc
FROM runs ORDER BY created_at, run
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, type=Path, help="store folder")
    parser.add_argument("--format", choices=FORMATS, default="table")


def run(args: argparse.Namespace) -> int:
    from stepscope.store import open_store

    with open_store(args.store) as store:
        print(render(store.sql(RUNS_QUERY), args.format))
    return 0
