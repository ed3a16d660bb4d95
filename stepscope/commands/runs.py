"""``stepscope runs --store DIR``: the runs in a store, one line each, with their profiled
windows: the scheduled steps and the watch's captures (``51-53 slow_step r1@40``: steps 51-53,
captured because step 40 of rank 1 was slow)."""

from __future__ import annotations

import argparse
from pathlib import Path

from stepscope.commands._output import FORMATS, render
from stepscope.store.location import store_location

RUNS_QUERY = """
WITH win AS (
  SELECT DISTINCT run, kind, first_step, last_step, trigger_kind, trigger_rank, trigger_step
  FROM windows
),
per_run AS (
  SELECT run,
         string_agg(first_step || '-' || last_step, ', ' ORDER BY first_step)
           FILTER (WHERE kind = 'schedule') AS scheduled_steps,
         count(*) FILTER (WHERE kind = 'capture') AS captures,
         string_agg(first_step || '-' || last_step || ' ' || trigger_kind || ' r' || trigger_rank
                    || '@' || trigger_step, ', ' ORDER BY first_step)
           FILTER (WHERE kind = 'capture') AS capture_windows
  FROM win GROUP BY run
)
SELECT r.run, r.name, r.ranks, r.world_size, r.backend, r.gpu_name, r.events,
       strftime(r.created_at, '%Y-%m-%d %H:%M:%S') AS created_utc,
       w.scheduled_steps, coalesce(w.captures, 0) AS captures, w.capture_windows
FROM runs r LEFT JOIN per_run w USING (run)
ORDER BY r.created_at, r.run
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, type=store_location, help="store folder or URL (s3://bucket/prefix)")
    parser.add_argument("--format", choices=FORMATS, default="table")


def run(args: argparse.Namespace) -> int:
    from stepscope.store import open_store

    with open_store(args.store) as store:
        print(render(store.sql(RUNS_QUERY), args.format))
    return 0
