"""Table-driven classification of trace events into ``kind`` and ``category``.

Every rule lives in the tables below, in order, so adding a kernel family is one line and each
line is tested on real names from the shared traces (``tests/test_classify.py``). Nothing here
looks at more than an event's Kineto ``cat`` and ``name``.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

KIND_BY_CAT: dict[str, str] = {
    # Current Kineto categories.
    "cpu_op": "cpu_op",
    "python_function": "python_function",
    "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_annotation",
    "cuda_runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver",
    "mtia_runtime": "cuda_runtime",
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "ac2g": "flow",
    "async_cpu_to_gpu": "flow",
    "fwdbwd": "flow",
    "async_gpu": "flow",
    # Pre-2021 Kineto category names.
    "operator": "cpu_op",
    "runtime": "cuda_runtime",
    "memcpy": "memcpy",
    "memset": "memset",
}
"""Kineto ``cat`` (lower-cased) -> ``kind``. Anything else is ``other``, except ``[memory]``."""

FLOW_PHASES = frozenset({"s", "t", "f"})

COMMUNICATION_KERNELS: tuple[tuple[str, str], ...] = (
    (r"^nccl", "NCCL kernels, old ncclKernel_* and new ncclDevKernel_* (RCCL uses the same names)"),
    (r"^rccl", "RCCL kernels named rccl*"),
    (r"multimem_", "NVLS multimem_all_reduce_kernel / multimem_all_gather (symmetric memory)"),
    (r"^(void )?(vllm::)?cross_device_reduce", "vLLM custom all-reduce"),
    (r"dpsk::ep::|deep_ep::", "DeepEP expert-parallel dispatch/combine"),
    (r"^hccl", "HCCL (Gaudi, MTIA) collectives"),
)
"""Kernel name patterns (regex, searched) that mark GPU work as communication."""

COMMUNICATION_HOST_OPS: tuple[tuple[str, str], ...] = (
    (r"^c10d::", "c10d collective ops, e.g. c10d::allreduce_"),
    (r"^c10d_functional::", "functional collectives, e.g. c10d_functional::all_reduce"),
    (r"^_c10d_functional::", "functional collectives (private namespace)"),
    (r"^(gloo|nccl|hccl|ucc|mpi):", "backend annotations, e.g. gloo:all_reduce, nccl:all_reduce"),
    (r"^record_param_comms$", "the op that carries collective metadata"),
    (r"^symm_mem::", "symmetric-memory collectives"),
    (r"^vllm::all_reduce$", "vLLM's all-reduce op"),
)
"""Host-side op names (cpu_op, user_annotation) that are communication."""

SYNC_RUNTIME_CALLS = re.compile(
    r"^(cuda|hip)(DeviceSynchronize|StreamSynchronize|EventSynchronize|StreamWaitEvent"
    r"|StreamQuery|EventQuery)$"
)
"""Runtime calls where the host waits for the device: category ``sync``."""

SYNC_CATS = frozenset({"cuda_sync"})
"""Kineto categories that record device-side waits."""

MEMCPY_DIRECTIONS: tuple[tuple[str, str], ...] = (
    (r"HtoD|Host -> Device|Pinned -> Device|Pageable -> Device|H2D", "memcpy_h2d"),
    (r"DtoH|Device -> Host|Device -> Pinned|Device -> Pageable|D2H", "memcpy_d2h"),
    (r"DtoD|Device -> Device|D2D|PtoP|Peer", "memcpy_d2d"),
)
"""Memcpy name patterns -> direction category; unmatched copies are ``memcpy_other``."""

COLLECTIVE_NAMES: tuple[tuple[str, str], ...] = (
    (r"all_?to_?all", "all_to_all"),
    (r"reduce_?scatter", "reduce_scatter"),
    (r"all_?gather", "all_gather"),
    (r"all_?reduce", "all_reduce"),
    (r"broadcast", "broadcast"),
    (r"barrier", "barrier"),
    (r"sendrecv|send_?recv", "send_recv"),
    (r"(^|[^a-z])send", "send"),
    (r"(^|[^a-z])recv", "recv"),
    (r"gather", "gather"),
    (r"scatter", "scatter"),
    (r"reduce", "reduce"),
)
"""Collective name (``Collective name`` arg or op/kernel name) -> normalised collective.
Order matters: ``reduce_scatter`` before ``reduce``, ``all_gather`` before ``gather``."""


HOST_KINDS = frozenset({"cpu_op", "python_function", "user_annotation", "cuda_runtime", "cuda_driver"})
GPU_SIDE_KINDS = frozenset({"kernel", "memcpy", "memset", "gpu_annotation"})
"""Kinds that run on the device and take the step of the runtime call that launched them."""
LAUNCH_KINDS = frozenset({"cuda_runtime", "cuda_driver"})
"""Kinds whose ``correlation`` ties a launch to the GPU work it issued."""
STEP_KINDS = frozenset({"user_annotation", "cpu_op"})
"""Kinds whose ``ProfilerStep#N`` events mark a profiler step's window."""
COLLECTIVE_PREFIXES = ("ncclkernel_", "nccldevkernel_")
"""Stripped (lower-cased) from a kernel's name before its collective is looked up."""


# --- the tables compiled to SQL: ingest classifies every event in DuckDB with these -----------

def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _any_of(rules: tuple[tuple[str, str], ...], case_insensitive: bool = True) -> str:
    """One RE2 pattern matching where any rule's pattern matches (search semantics)."""
    joined = "|".join(f"(?:{pattern})" for pattern, _ in rules)
    return _quote(("(?i)" if case_insensitive else "") + joined)


def _sql_set(values: frozenset[str]) -> str:
    return "(" + ", ".join(_quote(v) for v in sorted(values)) + ")"


def kind_sql(cat: str, name: str, ph: str) -> str:
    """SQL for ``events.kind`` from the SQL expressions of Kineto's ``cat``, ``name`` and ``ph``."""
    by_cat = " ".join(f"WHEN {_quote(c)} THEN {_quote(k)}" for c, k in KIND_BY_CAT.items())
    return (f"CASE WHEN {name} = '[memory]' THEN 'memory' ELSE coalesce(CASE lower({cat}) {by_cat} END, "
            f"CASE WHEN {ph} IN {_sql_set(FLOW_PHASES)} THEN 'flow' ELSE 'other' END) END")


def category_sql(kind: str, cat: str, name: str) -> str:
    """SQL for ``events.category`` from the expressions of the event's kind, ``cat`` and name."""
    memcpy = " ".join(f"WHEN regexp_matches({name}, {_quote('(?i)' + p)}) THEN {_quote(c)}"
                      for p, c in MEMCPY_DIRECTIONS)
    host_kinds = HOST_KINDS - LAUNCH_KINDS
    return f"""CASE
        WHEN {kind} = 'kernel' THEN CASE WHEN regexp_matches({name}, {_any_of(COMMUNICATION_KERNELS)})
                                         THEN 'communication' ELSE 'compute' END
        WHEN {kind} = 'memcpy' THEN CASE {memcpy} ELSE 'memcpy_other' END
        WHEN {kind} = 'memset' THEN 'memset'
        WHEN {kind} IN {_sql_set(LAUNCH_KINDS)}
            THEN CASE WHEN regexp_matches({name}, {_quote(SYNC_RUNTIME_CALLS.pattern)}) THEN 'sync' ELSE 'host' END
        WHEN {kind} IN {_sql_set(host_kinds)}
            THEN CASE WHEN regexp_matches({name}, {_any_of(COMMUNICATION_HOST_OPS)})
                      THEN 'communication' ELSE 'host' END
        WHEN {kind} = 'other' AND lower({cat}) IN {_sql_set(SYNC_CATS)} THEN 'sync'
    END"""


def collective_sql(name: str) -> str:
    """SQL for the normalised collective of a name (``Collective name`` arg or op/kernel name)."""
    prefixes = "".join(f"({p})?" for p in COLLECTIVE_PREFIXES)
    lowered = f"regexp_replace(lower({name}), {_quote('^' + prefixes)}, '')"
    cases = " ".join(f"WHEN regexp_matches({lowered}, {_quote(p)}) THEN {_quote(c)}" for p, c in COLLECTIVE_NAMES)
    return f"CASE {cases} END"


def dtype_key_sql(dtype: str) -> str:
    """SQL for the ``DTYPE_BYTES`` key of a dtype name (lower case, ``c10::``/``torch.`` dropped)."""
    return f"regexp_replace(regexp_replace(lower({dtype}), '^c10::', ''), '^torch\\.', '')"


def dtype_bytes_sql(dtype: str) -> str:
    """SQL for the element size of a dtype name, null when unknown."""
    cases = " ".join(f"WHEN {_quote(k)} THEN {v}" for k, v in DTYPE_BYTES.items())
    return f"CASE {dtype_key_sql(dtype)} {cases} END"


# --- the same SQL, evaluated for one value (tests, other callers) ------------------------------

@lru_cache(maxsize=1)
def _connection() -> Any:
    from stepscope.store.engine import connect

    return connect(limit="256MB", spill=False, threads=1)


def _one(select: str, params: dict[str, Any]) -> tuple[Any, ...]:
    return _connection().execute(f"SELECT {select}", params).fetchone()


@lru_cache(maxsize=65536)
def classify(cat: str | None, name: str, ph: str) -> tuple[str, str | None]:
    """``(kind, category)`` of one event, by the SQL that ingest runs on every event."""
    kind = kind_sql("$cat::VARCHAR", "$name::VARCHAR", "$ph::VARCHAR")
    return _one(f"{kind}, {category_sql(kind, '$cat::VARCHAR', '$name::VARCHAR')}",
                {"cat": cat, "name": name, "ph": ph})


@lru_cache(maxsize=4096)
def is_communication_host_op(name: str) -> bool:
    """True when a host op or annotation is a collective call (the rule ingest applies)."""
    return bool(_one(f"regexp_matches($name::VARCHAR, {_any_of(COMMUNICATION_HOST_OPS)})", {"name": name})[0])


@lru_cache(maxsize=4096)
def normalise_collective(name: str) -> str | None:
    """``all_reduce`` from ``allreduce``, ``_allgather_base``, ``ncclDevKernel_AllReduce_...``."""
    return _one(collective_sql("$name::VARCHAR"), {"name": name})[0]


DTYPE_BYTES: dict[str, int] = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2,
    "bfloat16": 2, "int": 4, "int32": 4, "long": 8, "int64": 8, "short": 2, "int16": 2,
    "char": 1, "int8": 1, "byte": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1,
    "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "complexfloat": 8,
    "complexdouble": 16, "uint16": 2, "uint32": 4, "uint64": 8,
}
"""Element size in bytes by dtype name as torch and Kineto print it (``c10::`` stripped)."""


def dtype_bytes(dtype: str | None) -> int | None:
    """Element size of a dtype name (``Float``, ``c10::BFloat16``, ``float``), or None."""
    if not dtype:
        return None
    return _one(dtype_bytes_sql("$dtype::VARCHAR"), {"dtype": dtype})[0]
