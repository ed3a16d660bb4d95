"""``stepscope accept CANDIDATE --reason "..." --store DIR [--baseline NAME]``: record a known,
intended change. The reason is kept beside the run (``acceptances/<run>.json``) and the run
becomes baseline NAME, alone (its earlier runs measured the code before the change), so the next
comparison starts from it."""

from __future__ import annotations

import argparse
from pathlib import Path
from stepscope.store.location import store_location


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("candidate", help="run id in the store whose change is accepted")
    parser.add_argument("--reason", required=True, help="why the change is intended (kept with the run)")
    parser.add_argument("--store", required=True, type=store_location, help="store folder or URL (s3://bucket/prefix)")
    parser.add_argument("--baseline", default="main", metavar="NAME",
                        help="baseline name that now points to CANDIDATE (default: main)")


def run(args: argparse.Namespace) -> int:
    from stepscope.commands.baseline import _known_run
    from stepscope.store.baselines import baseline_run, record_acceptance, set_baseline

    run_id = _known_run(args.store, args.candidate)
    previous = baseline_run(args.store, args.baseline)
    path = record_acceptance(args.store, run_id, args.reason, baseline=args.baseline, compared_to=previous)
    # The older runs measured the code before the change: their spread is not this code's noise.
    set_baseline(args.store, args.baseline, run_id, reason=f"accepted: {args.reason}", append=False)
    was = f" (was {previous})" if previous else ""
    print(f"accepted {run_id}: baseline {args.baseline} -> {run_id}{was}; reason kept in {path}")
    return 0
