"""The store: Kineto traces as versioned, Hive-partitioned Parquet, queried through DuckDB."""

from stepscope.store.catalog import Store, open_store
from stepscope.store.schema import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "Store", "open_store"]
