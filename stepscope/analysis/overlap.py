"""How much of each interval (a collective, a copy) runs under compute, in SQL.

``hidden_ctes`` (``hidden_ns`` of an interval: the part of it under the rank's compute-kernel
union) lives in :mod:`stepscope.store.rankstats.sweep`, below both the analyses and the store's
converter, which stores each rank's copies with it at ingest; it is re-exported here.
"""

from __future__ import annotations

from stepscope.store.rankstats.sweep import COMPUTE_KERNELS_SQL, hidden_ctes  # noqa: F401 - re-exported
