"""The store: Kineto traces as versioned, Hive-partitioned Parquet, queried through DuckDB.

``open_store`` and ``Store`` resolve lazily: ingest never needs DuckDB, and importing it costs
~0.2 s of a CLI call.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from stepscope.store.constants import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "Store", "open_store"]


def __getattr__(name: str) -> Any:
    if name in ("Store", "open_store"):
        return getattr(import_module("stepscope.store.catalog"), name)
    raise AttributeError(f"module 'stepscope.store' has no attribute {name!r}")
