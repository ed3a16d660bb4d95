"""``stepscope migrate --store DIR``: bring a store written by an older stepscope up to date.

A store of an older schema version is refused by every other command with a line that names
this one. Migrating computes what the new version stores for each trace from what the store
already holds (no trace file is read again) and is safe to run twice.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, type=Path, help="store folder")


def run(args: argparse.Namespace) -> int:
    from stepscope.errors import StoreError
    from stepscope.store.constants import SCHEMA_VERSION
    from stepscope.store.migrate import migrate_store

    if not (args.store / "sources").is_dir():
        raise StoreError(f"{args.store}: no such store (nothing to migrate)")
    report = migrate_store(args.store)
    for run_id, rank, source in report.migrated:
        print(f"run {run_id} rank {rank} ({source}): migrated to schema version {SCHEMA_VERSION}")
    print(f"{args.store}: {len(report.migrated)} traces migrated, {report.up_to_date} already at "
          f"schema version {SCHEMA_VERSION}")
    return 0
