"""``stepscope whatif --run R --change 'comm_transfer*0.5' --change 'rank 7: on time'``.

Replays each step of the run with the changes (:mod:`stepscope.analysis.replay`) and prints the
predicted step beside the measured one, with the error bar: how far the replay of the same run
unchanged lies from its measured steps. ``--format json`` prints :meth:`WhatIf.to_json`.
"""

from __future__ import annotations

import argparse
import json

from stepscope.commands.summary import resolve_run
from stepscope.errors import Inconclusive
from stepscope.store.location import store_location


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, type=store_location, help="store folder or URL (s3://bucket/prefix)")
    parser.add_argument("--run", help="run name or id (default: the store's only run)")
    parser.add_argument("--rank", type=int, action="append", metavar="R", help="only this rank (repeat for several)")
    parser.add_argument("--step", type=int, action="append", metavar="N",
                        help="only this step (repeat for several): 'on time' and comm_volume then learn from these "
                             "steps alone")
    parser.add_argument("--change", action="append", default=[], metavar="CHANGE",
                        help="PART*FACTOR, 'rank R: PART*FACTOR', 'comm_volume*FACTOR', 'copies hidden', "
                             "'no launch gaps', or 'rank R: on time': R as busy as its peers, its k-th least busy "
                             "step as theirs, its excess taken off the host time before the collectives it reached "
                             "last (repeat for several)")
    parser.add_argument("--format", choices=("table", "json"), default="table")


def run(args: argparse.Namespace) -> int:
    from stepscope.analysis.replay import parse_change, what_if
    from stepscope.store import open_store
    from stepscope.units import duration

    changes = [parse_change(c) for c in args.change]
    with open_store(args.store) as store:
        run_id = resolve_run(store, args.run)
        result = what_if(store, run_id, changes, args.rank, args.step)
    if result is None:
        raise Inconclusive(f"run {run_id}: no step windows" + (f" among steps {args.step}" if args.step else "")
                           + ", nothing to replay")
    if args.format == "json":
        print(json.dumps(result.to_json(), indent=2))
        return 0
    err = f"± {duration(result.error_ns)}"
    print(f"run {run_id}: {', '.join(result.changes) or 'no change'}")
    print(f"  measured step   {duration(result.measured_ns)}")
    print(f"  replayed as is  {duration(result.unchanged_ns)} (error bar {err}, "
          f"{100 * result.error_share:.2f}% of the step)")
    print(f"  predicted step  {duration(result.predicted_ns)} {err}  (saves {duration(result.saving_ns)} per step)")
    if result.heldout_error_ns is None:
        print("  held-out error  absent: one step only (each step is predicted from the others)")
    else:
        print(f"  held-out error  ± {duration(result.heldout_error_ns)} (a step against the median of the other "
              f"steps' replays: the run's own step-to-step variation)")
    if result.unpaired is not None:
        print(f"  unpaired        {result.unpaired.count} point-to-point transfers replay as measured: "
              f"{result.unpaired.reason}")
    for s in result.steps:
        print(f"    step {s.step}: measured {duration(s.measured_ns)}, replayed {duration(s.unchanged_ns)}, "
              f"predicted {duration(s.predicted_ns)}")
    return 0
