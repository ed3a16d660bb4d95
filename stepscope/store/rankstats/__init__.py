"""Each rank's answers, computed where its trace is converted: SQL over one rank's events.

A 1,024-rank job must not be reduced by one process reading every event of every rank. The
figures that need a rank's events (and only its events) are computed here, as SQL over relations
named like the store's views (``events``, ``steps``, with ``run`` and ``rank`` columns), and
stored as tables of their own when the trace is ingested: by the ingest worker offline, and on
the rank itself by the collector (which ingests through the same path). Cross-rank analyses
read these tables, never all events.

This package sits below both the store's converter (which runs the reducers, ``reduce.py``) and
the analysis layer (which reads their tables, and runs the same SQL over the store's views where
it has not been stored); it imports neither, nor torch, nor streamlit.

- ``sweep.py``: the interval sweep (exclusive, overlapped and idle time as exact integers) and
  the hidden time of intervals under the rank's compute kernels.
- ``copies.py``: every copy of the rank with its direction, host memory and hidden time
  (table ``rank_copies``).
- ``parts.py``: the catalogue of a step's parts (GPU and host), the one list of them.
- ``breakdown.py``: the step breakdown's SQL generated from the catalogue, and the tables
  ``rank_step_gpu``, ``rank_step_host`` (each step's parts) and ``rank_comm_spans`` (where its
  exposed communication lies, for the cross-rank split into waiting and transfer).
- ``reduce.py``: the registry of per-rank tables and the run of all of them over one trace.
- ``kernels.py``: also each trace's launch totals (table ``rank_launches``).
- ``memory.py``: also the device's highest peak and what is live at it, the allocations per step,
  the allocations the memory answers can need, and the bounded allocator curve (tables
  ``rank_memory_live``, ``rank_memory_steps``, ``rank_memory_allocations``, ``rank_memory_curve``).
- ``pipeline.py``: each rank's point-to-point transfers, runtime-schedule actions and (on a
  pipeline rank) work items with their phase (tables ``rank_p2p``, ``rank_pipeline_actions``,
  ``rank_pipeline_work``), which the pipeline analysis cuts into microbatch spans.
- ``flops.py``: the FLOP formulas of matrix products, convolutions and attention as SQL, each
  product counted once, and the kernels of the counted ops (tables ``rank_flop_ops`` and
  ``rank_flop_traces``).
- ``segments.py``: each trace's time line cut into its parts (``rank_segments``, what arbitrary
  windows and the step timeline are split by) and its step windows (``rank_step_windows``).
"""

from stepscope.store.rankstats.reduce import (TABLES, RankTable, Specialised, no_rows, params,  # noqa: E402
                                              prepare, present, queries, share, trace_views)

__all__ = ["TABLES", "RankTable", "Specialised", "no_rows", "params", "prepare", "present", "queries", "share",
           "trace_views"]
