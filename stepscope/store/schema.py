"""The store's Parquet schema, as code: one place that defines every table and its version.

Every Parquet file the store writes carries ``SCHEMA_VERSION`` in its key/value metadata, so a
reader (ours or anyone's) can tell which layout it holds. docs/STORE.md documents the same tables
for people; ``tests/test_docs.py`` checks that the two agree.

Partition columns (``run``, ``rank``) are not stored inside the files: they come from the
Hive-style directory names ``<table>/run=<id>/rank=<r>/part-<source>.parquet``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from stepscope.store.rankstats.breakdown import WINDOW_COLUMNS, stored_columns
from stepscope.store.rankstats.parts import GPU, HOST, Breakdown
from stepscope.store.constants import (  # noqa: F401 - part of this module's interface
    INT64_MAX,
    INT64_MIN,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    SOURCES_COLUMNS,
    TABLE_KEY,
    file_metadata,
    out_of_range,
)

KINDS = (
    "cpu_op",
    "python_function",
    "user_annotation",
    "gpu_annotation",
    "cuda_runtime",
    "cuda_driver",
    "kernel",
    "memcpy",
    "memset",
    "memory",
    "flow",
    "other",
)
"""Values of ``events.kind``: what produced the event (Kineto's ``cat``, normalised)."""

CATEGORIES = (
    "compute",
    "communication",
    "memcpy_h2d",
    "memcpy_d2h",
    "memcpy_d2d",
    "memcpy_other",
    "memset",
    "sync",
    "host",
)
"""Values of ``events.category``: what kind of work the event is; null for non-work events."""

_STR = pa.dictionary(pa.int32(), pa.string())

EVENTS = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("kind", _STR, nullable=False),
        pa.field("category", _STR),
        pa.field("name", pa.string()),
        pa.field("ph", _STR),
        pa.field("ts_ns", pa.int64()),
        pa.field("dur_ns", pa.int64()),
        pa.field("pid", pa.int64()),
        pa.field("tid", pa.int64()),
        pa.field("thread_label", pa.string()),
        pa.field("stream", pa.int64()),
        pa.field("device", pa.int64()),
        pa.field("correlation", pa.int64()),
        pa.field("external_id", pa.int64()),
        pa.field("flow_id", pa.int64()),
        pa.field("step", pa.int64()),
        pa.field("bytes", pa.int64()),
        pa.field("collective", _STR),
        pa.field("in_nelems", pa.int64()),
        pa.field("out_nelems", pa.int64()),
        pa.field("dtype", _STR),
        pa.field("group_size", pa.int64()),
        pa.field("pg_name", _STR),
        pa.field("pg_desc", _STR),
        pa.field("pg_ranks", _STR),
        pa.field("comm_seq", pa.int64()),
        pa.field("args", pa.string()),
    ]
)

STEPS = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("end_ns", pa.int64(), nullable=False),
        pa.field("dur_ns", pa.int64(), nullable=False),
    ]
)

MEMORY = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("ts_ns", pa.int64(), nullable=False),
        pa.field("step", pa.int64()),
        pa.field("addr", pa.int64()),
        pa.field("bytes", pa.int64()),
        pa.field("total_allocated", pa.int64()),
        pa.field("total_reserved", pa.int64()),
        pa.field("device_type", pa.int64()),
        pa.field("device", pa.int64()),
    ]
)

_ARROW_TYPES = {"string": pa.string(), "int64": pa.int64(), "timestamp_utc": pa.timestamp("us", tz="UTC")}

SOURCES = pa.schema([pa.field(name, _ARROW_TYPES[kind], nullable=nullable)
                     for name, kind, nullable in SOURCES_COLUMNS])

STEP_TIMES = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("wall_ns", pa.int64(), nullable=False),
        pa.field("cpu_ns", pa.int64()),
        pa.field("preemptions", pa.int64()),
        pa.field("gpu_ns", pa.int64()),
        pa.field("profiled", pa.bool_()),
        pa.field("tokens", pa.int64()),
        pa.field("samples", pa.int64()),
        pa.field("disturbed_by", _STR),
        pa.field("others_cpu_ns", pa.int64()),
    ]
)

MEMORY_ROLES = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("role", _STR, nullable=False),
        pa.field("name", pa.string()),
        pa.field("addr", pa.int64(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("device_type", pa.int64()),
        pa.field("device", pa.int64()),
        pa.field("step", pa.int64()),
    ]
)

MEMORY_SNAPSHOT = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("record", _STR, nullable=False),
        pa.field("device", pa.int64()),
        pa.field("ts_ns", pa.int64()),
        pa.field("action", _STR),
        pa.field("state", _STR),
        pa.field("addr", pa.int64()),
        pa.field("bytes", pa.int64()),
        pa.field("requested_bytes", pa.int64()),
        pa.field("stream", pa.int64()),
        pa.field("segment_addr", pa.int64()),
        pa.field("segment_type", _STR),
        pa.field("frames", pa.string()),
    ]
)

CAPTURES = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("first_step", pa.int64(), nullable=False),
        pa.field("last_step", pa.int64(), nullable=False),
        pa.field("trigger_kind", _STR, nullable=False),
        pa.field("trigger_rank", pa.int64(), nullable=False),
        pa.field("trigger_step", pa.int64(), nullable=False),
        pa.field("observed_ns", pa.int64(), nullable=False),
        pa.field("reference_ns", pa.int64(), nullable=False),
        pa.field("agreed_step", pa.int64()),
    ]
)


RANK_COPIES = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("step", pa.int64()),
        pa.field("ts_ns", pa.int64()),
        pa.field("dur_ns", pa.int64()),
        pa.field("stream", pa.int64()),
        pa.field("name", pa.string()),
        pa.field("bytes", pa.int64()),
        pa.field("direction", _STR),
        pa.field("host_memory", _STR),
        pa.field("hidden_ns", pa.int64()),
        pa.field("exposed_ns", pa.int64()),
    ]
)
"""Each rank's copies with their hidden time: computed at ingest (``stepscope.store.rankstats``)."""


def _rank_step(breakdown: Breakdown) -> pa.Schema:
    """``rank_step_<name>``: a step's window and its parts, columns from the part catalogue."""
    return pa.schema(
        [pa.field("source", _STR, nullable=False), pa.field("step", pa.int64(), nullable=False)]
        + [pa.field(name, pa.int64()) for name, _ in WINDOW_COLUMNS[breakdown]]
        + [pa.field(column, pa.int64(), nullable=False) for column in stored_columns(breakdown)]
    )


RANK_STEP_GPU = _rank_step(GPU)
RANK_STEP_HOST = _rank_step(HOST)

RANK_GPU_TOTALS = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("scope", _STR, nullable=False),
        pa.field("gpu_start_ns", pa.int64(), nullable=False),
        pa.field("gpu_end_ns", pa.int64(), nullable=False),
        pa.field("gpu_events", pa.int64(), nullable=False),
        pa.field("gpu_busy_ns", pa.int64(), nullable=False),
        pa.field("compute_ns", pa.int64(), nullable=False),
        pa.field("comm_ns", pa.int64(), nullable=False),
        pa.field("comm_comp_overlap_ns", pa.int64(), nullable=False),
    ]
)

RANK_COMM_SPANS = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("part", _STR, nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("s0", pa.int64(), nullable=False),
        pa.field("s1", pa.int64(), nullable=False),
    ]
)

RANK_COLLECTIVES = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("pid", pa.int64()),
        pa.field("tid", pa.int64()),
        pa.field("step", pa.int64()),
        pa.field("name", pa.string()),
        pa.field("ts_ns", pa.int64(), nullable=False),
        pa.field("dur_ns", pa.int64(), nullable=False),
        pa.field("end_ns", pa.int64(), nullable=False),
        pa.field("stream", pa.int64()),
        pa.field("correlation", pa.int64()),
        pa.field("host_side", pa.bool_(), nullable=False),
        pa.field("collective", _STR),
        pa.field("bytes", pa.int64()),
        pa.field("dtype", _STR),
        pa.field("group_size", pa.int64()),
        pa.field("pg_name", _STR),
        pa.field("pg_desc", _STR),
        pa.field("pg_ranks", pa.string()),
        pa.field("comm_seq", pa.int64()),
        pa.field("linked", pa.bool_(), nullable=False),
        pa.field("phase", _STR),
    ]
)

RANK_HIDING_SPANS = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("s0", pa.int64(), nullable=False),
        pa.field("s1", pa.int64(), nullable=False),
        pa.field("before_ns", pa.int64(), nullable=False),
    ]
)
"""Each rank's collective events with what each is (``stepscope.store.rankstats.collectives``)."""

RANK_KERNELS = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("name", pa.string()),
        pa.field("kind", _STR),
        pa.field("category", _STR),
        pa.field("count", pa.int64(), nullable=False),
        pa.field("total_ns", pa.int64(), nullable=False),
        pa.field("max_ns", pa.int64(), nullable=False),
    ]
)
"""Each rank's GPU work by name (``stepscope.store.rankstats.kernels``)."""

RANK_CPU_OPS = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("name", pa.string()),
        pa.field("category", _STR),
        pa.field("count", pa.int64(), nullable=False),
        pa.field("total_ns", pa.int64(), nullable=False),
        pa.field("self_ns", pa.int64(), nullable=False),
        pa.field("sync_ns", pa.int64(), nullable=False),
        pa.field("max_ns", pa.int64(), nullable=False),
    ]
)
"""Each rank's CPU operators by name, with self and synchronisation time."""

RANK_MEMORY_PEAKS = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("device_type", pa.int64()),
        pa.field("device", pa.int64()),
        pa.field("step", pa.int64()),
        pa.field("events", pa.int64(), nullable=False),
        pa.field("peak_allocated_bytes", pa.int64()),
        pa.field("peak_ts_ns", pa.int64()),
        pa.field("peak_reserved_bytes", pa.int64()),
        pa.field("min_allocated_bytes", pa.int64()),
        pa.field("rebuilt", pa.bool_()),
        pa.field("phase", _STR),
        pa.field("ops_at_peak", pa.list_(pa.string())),
    ]
)
"""Each rank's memory peak per device and step (``stepscope.store.rankstats.memory``)."""

RANK_LAUNCHES = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("launches", pa.int64(), nullable=False),
        pa.field("launch_ns", pa.int64()),
        pa.field("launched_gpu_ns", pa.int64()),
        pa.field("short_launches", pa.int64(), nullable=False),
        pa.field("median_launch_delay_ns", pa.float64()),
    ]
)
"""Each rank's launch calls against the GPU work they launched (``stepscope.store.rankstats.kernels``)."""

RANK_MEMORY_LIVE = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("device_type", pa.int64()),
        pa.field("device", pa.int64()),
        pa.field("first_ts_ns", pa.int64()),
        pa.field("last_ts_ns", pa.int64()),
        pa.field("peak_ts_ns", pa.int64()),
        pa.field("peak_allocated_bytes", pa.int64()),
        pa.field("live_allocations", pa.int64(), nullable=False),
        pa.field("live_bytes", pa.int64(), nullable=False),
    ]
)
"""Each rank's highest memory peak per device and what is live at it (``stepscope.store.rankstats.memory``)."""

RANK_MEMORY_STEPS = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("device_type", pa.int64()),
        pa.field("device", pa.int64()),
        pa.field("step", pa.int64()),
        pa.field("allocations", pa.int64(), nullable=False),
        pa.field("bytes", pa.int64()),
    ]
)
"""Each rank's allocations per device and step (``stepscope.store.rankstats.memory``)."""

RANK_MEMORY_ALLOCATIONS = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("memory_index", pa.int64(), nullable=False),
        pa.field("device_type", pa.int64()),
        pa.field("device", pa.int64()),
        pa.field("addr", pa.int64()),
        pa.field("bytes", pa.int64()),
        pa.field("step", pa.int64()),
        pa.field("alloc_ts_ns", pa.int64()),
        pa.field("free_ts_ns", pa.int64()),
        pa.field("allocated_by", pa.list_(pa.string())),
    ]
)
"""Each rank's largest allocations, those live at its peak and those that may hold a role
(``stepscope.store.rankstats.memory``)."""

RANK_MEMORY_CURVE = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("device_type", pa.int64()),
        pa.field("device", pa.int64()),
        pa.field("bucket", pa.int64(), nullable=False),
        pa.field("ts_ns", pa.int64()),
        pa.field("total_allocated", pa.int64()),
        pa.field("total_reserved", pa.int64()),
        pa.field("rebuilt", pa.bool_()),
    ]
)
"""Each rank's allocator curve per device in bounded time buckets (``stepscope.store.rankstats.memory``)."""
RANK_P2P = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("step", pa.int64()),
        pa.field("ts_ns", pa.int64(), nullable=False),
        pa.field("dur_ns", pa.int64()),
        pa.field("send", pa.bool_(), nullable=False),
        pa.field("peer_index", pa.int64()),
    ]
)
"""Each rank's point-to-point transfers (``stepscope.store.rankstats.pipeline``)."""

RANK_PIPELINE_ACTIONS = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("ts_ns", pa.int64(), nullable=False),
        pa.field("end_ns", pa.int64(), nullable=False),
        pa.field("stage", pa.int64(), nullable=False),
        pa.field("action", pa.string(), nullable=False),
        pa.field("microbatch", pa.int64(), nullable=False),
    ]
)
"""Each rank's runtime-schedule actions (``stepscope.store.rankstats.pipeline``)."""

RANK_PIPELINE_WORK = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("issue_ns", pa.int64(), nullable=False),
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("end_ns", pa.int64(), nullable=False),
        pa.field("phase", pa.string(), nullable=False),
        pa.field("on_gpu", pa.bool_(), nullable=False),
    ]
)
"""Each pipeline rank's work items with their phase (``stepscope.store.rankstats.pipeline``)."""
RANK_FLOP_OPS = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("pid", pa.int64()),
        pa.field("tid", pa.int64()),
        pa.field("step", pa.int64()),
        pa.field("name", pa.string()),
        pa.field("family", _STR),
        pa.field("leaf", pa.bool_()),
        pa.field("ts_ns", pa.int64()),
        pa.field("dur_ns", pa.int64()),
        pa.field("flops", pa.int64()),
        pa.field("flops_source", _STR),
        pa.field("dtype", _STR),
        pa.field("counted", pa.bool_()),
        pa.field("reason", pa.string()),
        pa.field("gpu_ns", pa.int64()),
        pa.field("kernels", pa.int64()),
        pa.field("tf32", pa.bool_()),
    ]
)
"""Each rank's ops of a FLOP family with their FLOPs, counted once (``stepscope.store.rankstats.flops``)."""

RANK_FLOP_TRACES = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("shapes", pa.bool_()),
        pa.field("kernels", pa.bool_()),
        pa.field("launches", pa.bool_()),
    ]
)
"""What FLOP counting needs to know of each trace of a rank (``stepscope.store.rankstats.flops``)."""
RANK_FLOP_SKIPPED = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("family", _STR, nullable=False),
        pa.field("ops", pa.int64(), nullable=False),
        pa.field("kernel_ns", pa.int64()),
    ]
)
"""Per trace and family, the product leaves the FLOP count skipped and their compute kernels' time."""
RANK_STEP_WINDOWS = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("cpu_start_ns", pa.int64()),
        pa.field("cpu_end_ns", pa.int64()),
        pa.field("gpu_end_ns", pa.int64()),
        pa.field("start_ns", pa.int64()),
        pa.field("end_ns", pa.int64()),
    ]
)
"""Each rank's step windows (``stepscope.store.rankstats.segments``)."""

RANK_SEGMENTS = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("breakdown", _STR, nullable=False),
        pa.field("part", _STR, nullable=False),
        pa.field("s0", pa.int64(), nullable=False),
        pa.field("s1", pa.int64(), nullable=False),
    ]
)
"""Each rank's time line, cut into its parts (``stepscope.store.rankstats.segments``)."""

RANK_EDGES = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("step", pa.int64()),
        pa.field("kind", _STR, nullable=False),
        pa.field("host_ts_ns", pa.int64(), nullable=False),
        pa.field("host_end_ns", pa.int64(), nullable=False),
        pa.field("dep_ts_ns", pa.int64()),
        pa.field("dep_end_ns", pa.int64()),
        pa.field("dep_stream", pa.int64()),
        pa.field("dep_tid", pa.int64()),
        pa.field("dep_comm", pa.bool_()),
    ]
)
"""Each rank's dependency edges: collective issues and host waits (``stepscope.store.rankstats.edges``)."""


# --- Memory snapshots (``stepscope ingest x.pickle``; ``stepscope.store.snapshot``) ---------------
SNAPSHOT_SEGMENTS = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("device", pa.int64()),
        pa.field("address", pa.int64()),
        pa.field("total_size", pa.int64()),
        pa.field("allocated_size", pa.int64()),
        pa.field("active_size", pa.int64()),
        pa.field("requested_size", pa.int64()),
        pa.field("stream", pa.int64()),
        pa.field("segment_type", _STR),
        pa.field("segment_pool", pa.string()),
        pa.field("is_expandable", pa.bool_()),
        pa.field("stack_id", pa.int64()),
    ]
)
"""Each segment the caching allocator held when the snapshot was taken."""

SNAPSHOT_BLOCKS = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("device", pa.int64()),
        pa.field("segment_address", pa.int64()),
        pa.field("address", pa.int64()),
        pa.field("size", pa.int64()),
        pa.field("requested_size", pa.int64()),
        pa.field("state", _STR),
        pa.field("stack_id", pa.int64()),
    ]
)
"""Each block of those segments, with the stack that allocated it."""

SNAPSHOT_EVENTS = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("device", pa.int64(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("action", _STR, nullable=False),
        pa.field("address", pa.int64()),
        pa.field("size", pa.int64()),
        pa.field("stream", pa.int64()),
        pa.field("ts_ns", pa.int64()),
        pa.field("stack_id", pa.int64()),
    ]
)
"""The allocator's event history (its ring buffer), in recorded order per device."""

SNAPSHOT_STACKS = pa.schema(
    [
        pa.field("source", _STR, nullable=False),
        pa.field("stack_id", pa.int64(), nullable=False),
        pa.field("depth", pa.int64(), nullable=False),
        pa.field("file", pa.string()),
        pa.field("line", pa.int64()),
        pa.field("function", pa.string()),
    ]
)
"""Each distinct stack of a snapshot once, one row per frame, innermost (depth 0) first."""

SNAPSHOT_TABLES = (
    ("snapshot_segments", SNAPSHOT_SEGMENTS, "one row per segment of an ingested memory snapshot"),
    ("snapshot_blocks", SNAPSHOT_BLOCKS, "one row per block of an ingested memory snapshot, with its stack"),
    ("snapshot_events", SNAPSHOT_EVENTS, "one row per allocator event in an ingested memory snapshot's history"),
    ("snapshot_stacks", SNAPSHOT_STACKS, "one row per frame of each distinct stack of an ingested memory snapshot"),
)
"""The tables one ingested snapshot writes (beside its ``sources`` row)."""
# --- end of memory snapshots ---------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    """A stored table: its directory under the store root and its Arrow schema."""

    name: str
    schema: pa.Schema
    doc: str


TABLES: dict[str, Table] = {
    table.name: table
    for table in (
        Table("sources", SOURCES, "one row per ingested trace file (one rank of one run)"),
        Table("events", EVENTS, "one row per trace event"),
        Table("steps", STEPS, "one row per ProfilerStep window per rank"),
        Table("memory", MEMORY, "one row per [memory] allocator event"),
        Table("step_times", STEP_TIMES, "one row per training step timed by the collector"),
        Table("memory_roles", MEMORY_ROLES, "storage of parameters, gradients, optimizer state"),
        Table("memory_snapshot", MEMORY_SNAPSHOT, "CUDA caching-allocator snapshot: segments, blocks, alloc/free history"),
        Table("captures", CAPTURES, "one row per rank and capture the watch triggered"),
        Table("rank_copies", RANK_COPIES, "one row per copy of a rank, with the time compute hides of it (computed at ingest)"),
        Table("rank_step_gpu", RANK_STEP_GPU, "one row per step of a rank with GPU work: its GPU parts (computed at ingest)"),
        Table("rank_step_host", RANK_STEP_HOST, "one row per step of a rank: its host parts (computed at ingest)"),
        Table("rank_gpu_totals", RANK_GPU_TOTALS, "whole-trace GPU totals of a rank, as HTA defines them (computed at ingest)"),
        Table("rank_comm_spans", RANK_COMM_SPANS, "where each step's exposed communication lies (computed at ingest)"),
        Table("rank_collectives", RANK_COLLECTIVES, "one row per collective event of a rank, with what it is (computed at ingest)"),
        Table("rank_hiding_spans", RANK_HIDING_SPANS, "what hides a rank's collectives, as disjoint stretches (computed at ingest)"),
        Table("rank_kernels", RANK_KERNELS, "one row per GPU activity name of a rank (computed at ingest)"),
        Table("rank_cpu_ops", RANK_CPU_OPS, "one row per CPU operator name of a rank, with self time (computed at ingest)"),
        Table("rank_memory_peaks", RANK_MEMORY_PEAKS, "one row per device and step of a rank: its memory peak (computed at ingest)"),
        Table("rank_launches", RANK_LAUNCHES, "one row per trace of a rank: its launch calls against the GPU work they launched (computed at ingest)"),
        Table("rank_memory_live", RANK_MEMORY_LIVE, "one row per device of a rank: its highest memory peak and the allocations live at it (computed at ingest)"),
        Table("rank_memory_steps", RANK_MEMORY_STEPS, "one row per device and step of a rank: its allocations (computed at ingest)"),
        Table("rank_memory_allocations", RANK_MEMORY_ALLOCATIONS, "a rank's largest allocations, those live at its peak and those that may hold a role (computed at ingest)"),
        Table("rank_memory_curve", RANK_MEMORY_CURVE, "one row per device and time bucket of a rank: its allocator curve, bounded (computed at ingest)"),
        Table("rank_p2p", RANK_P2P, "one row per point-to-point transfer of a rank (computed at ingest)"),
        Table("rank_pipeline_actions", RANK_PIPELINE_ACTIONS, "one row per runtime-schedule action of a rank (computed at ingest)"),
        Table("rank_pipeline_work", RANK_PIPELINE_WORK, "one row per work item of a pipeline rank, with its phase (computed at ingest)"),
        Table("rank_flop_ops", RANK_FLOP_OPS, "one row per matrix product, convolution or attention op of a rank, with its FLOPs (computed at ingest)"),
        Table("rank_flop_skipped", RANK_FLOP_SKIPPED, "one row per trace and FLOP family of a rank whose ops the count could not size, with their kernels' time (computed at ingest)"),
        Table("rank_flop_traces", RANK_FLOP_TRACES, "one row per trace of a rank: shapes recorded, GPU kernels, kernel launches (computed at ingest)"),
        Table("rank_step_windows", RANK_STEP_WINDOWS, "one row per step of a rank: its window (computed at ingest)"),
        Table("rank_segments", RANK_SEGMENTS, "one row per stretch of a rank's time line where a part holds (computed at ingest)"),
        Table("rank_edges", RANK_EDGES, "one row per collective a rank's host issued and per stretch its host waited (computed at ingest)"),
        *(Table(name, spec, doc) for name, spec, doc in SNAPSHOT_TABLES),
    )
}
"""Every table of the store. The collector's tables live here too: the store owns the schema."""

REWRITTEN_TABLES: tuple[str, ...] = ("step_times", "memory_roles", "memory_snapshot", "captures")
"""Tables the collector writes beside a trace after its ``sources`` row is committed, and may
rewrite later (``step_times`` every few minutes of a long job): the committed sources alone do not
say what they hold, so whatever caches answers per run must also look at their files."""

GROWING_TABLES: tuple[str, ...] = ("step_times",)
"""Tables that gained a nullable column without a schema version (``step_times.cpu_ns``,
``disturbed_by``, ``preemptions`` and ``others_cpu_ns``):
the store's view reads it as null in parts written before it, so no migration is needed."""

