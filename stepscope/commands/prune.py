"""``stepscope prune --store DIR --keep N [--older-than AGE] [--dry-run]``: remove old runs from a
store that CI keeps between jobs (an artifact grows by one run per push otherwise).

A run is removed when it is not among the ``--keep`` newest (by when it was ingested) and, with
``--older-than``, also older than AGE (``30d``, ``12h``, ``90m``, ``2w``). Runs that a baseline
name points at are always kept. Each run is removed whole (its ``sources`` partition first, so
a reader never sees half a run), with its cached frames and its acceptance record.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
from pathlib import Path

from stepscope.errors import UsageError

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([mhdw])\s*$")
_AGE_UNITS = {"m": dt.timedelta(minutes=1), "h": dt.timedelta(hours=1), "d": dt.timedelta(days=1),
              "w": dt.timedelta(weeks=1)}


def parse_age(text: str) -> dt.timedelta:
    """``"30d"`` -> 30 days; minutes ``m``, hours ``h``, days ``d``, weeks ``w``."""
    match = _AGE.match(text)
    if not match:
        raise UsageError(f"--older-than {text!r}: expected a number and a unit (m, h, d, w), e.g. 30d")
    return float(match[1]) * _AGE_UNITS[match[2]]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, type=Path, help="store folder")
    parser.add_argument("--keep", type=int, metavar="N", help="keep the N newest runs")
    parser.add_argument("--older-than", type=parse_age, metavar="AGE",
                        help="remove only runs older than AGE (e.g. 30d, 12h)")
    parser.add_argument("--dry-run", action="store_true", help="only list what would be removed")


def runs_to_prune(created: dict[str, dt.datetime], protected: set[str], *, keep: int | None,
                  older_than: dt.timedelta | None, now: dt.datetime) -> list[str]:
    """The runs to remove, oldest first: outside the ``keep`` newest (when given), older than
    ``older_than`` (when given), and not ``protected``."""
    newest_first = sorted(created, key=lambda run: (created[run], run), reverse=True)
    candidates = newest_first[keep:] if keep is not None else newest_first
    if older_than is not None:
        candidates = [run for run in candidates if now - created[run] > older_than]
    return sorted((run for run in candidates if run not in protected), key=lambda run: (created[run], run))


def run(args: argparse.Namespace) -> int:
    from stepscope.store import open_store
    from stepscope.store.baselines import forget_acceptance, protected_runs
    from stepscope.store.runs import remove_run

    if args.keep is None and args.older_than is None:
        raise UsageError("say what to prune: --keep N and/or --older-than AGE")
    if args.keep is not None and args.keep < 0:
        raise UsageError(f"--keep {args.keep}: must be 0 or more")
    with open_store(args.store) as store:
        rows = store.sql("SELECT run, created_at FROM runs").to_pylist()
    created = {r["run"]: _utc(r["created_at"]) for r in rows}
    protected = protected_runs(args.store)
    doomed = runs_to_prune(created, protected, keep=args.keep, older_than=args.older_than,
                           now=dt.datetime.now(dt.timezone.utc))
    verb = "would remove" if args.dry_run else "removed"
    for name in doomed:
        if not args.dry_run:
            remove_run(args.store, name)
            forget_acceptance(args.store, name)
        print(f"{verb} run {name} (ingested {created[name]:%Y-%m-%d %H:%M:%S} UTC)")
    kept = len(created) - len(doomed)
    print(f"{args.store}: {verb} {len(doomed)} run(s), {kept} kept"
          + (f" (baselines: {', '.join(sorted(protected))})" if protected else ""))
    return 0


def _utc(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
