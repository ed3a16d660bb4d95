"""Table-driven classification of trace events into ``kind`` and ``category``.

Every rule lives in the tables below, in order, so adding a kernel family is one line and each
line is tested on real names from the shared traces (``tests/test_classify.py``). Nothing here
looks at more than an event's Kineto ``cat`` and ``name``.
"""

from __future__ import annotations

import re
from functools import lru_cache

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


def _compile(rules: tuple[tuple[str, str], ...]) -> list[tuple[re.Pattern[str], str]]:
    return [(re.compile(pattern, re.IGNORECASE), value) for pattern, value in rules]


_COMM_KERNELS = _compile(COMMUNICATION_KERNELS)
_COMM_HOST = _compile(COMMUNICATION_HOST_OPS)
_MEMCPY = _compile(MEMCPY_DIRECTIONS)
_COLLECTIVES = _compile(COLLECTIVE_NAMES)

HOST_KINDS = frozenset({"cpu_op", "python_function", "user_annotation", "cuda_runtime", "cuda_driver"})


def is_communication_kernel(name: str) -> bool:
    """True when a GPU kernel's name marks it as a collective or point-to-point transfer."""
    return any(pattern.search(name) for pattern, _ in _COMM_KERNELS)


def is_communication_host_op(name: str) -> bool:
    """True when a host op or annotation is a collective call."""
    return any(pattern.search(name) for pattern, _ in _COMM_HOST)


def memcpy_direction(name: str) -> str:
    """Category of a memcpy by its name: ``memcpy_h2d``, ``memcpy_d2h``, ``memcpy_d2d`` or other."""
    for pattern, category in _MEMCPY:
        if pattern.search(name):
            return category
    return "memcpy_other"


def kind_of(cat: str | None, name: str, ph: str) -> str:
    """The event's ``kind`` from its Kineto category, name and phase."""
    if name == "[memory]":
        return "memory"
    kind = KIND_BY_CAT.get((cat or "").lower())
    if kind is not None:
        return kind
    if ph in FLOW_PHASES:
        return "flow"
    return "other"


@lru_cache(maxsize=65536)
def classify(cat: str | None, name: str, ph: str) -> tuple[str, str | None]:
    """``(kind, category)`` of one event. Cached: real traces repeat a few thousand names."""
    kind = kind_of(cat, name, ph)
    if kind == "kernel":
        return kind, "communication" if is_communication_kernel(name) else "compute"
    if kind == "memcpy":
        return kind, memcpy_direction(name)
    if kind == "memset":
        return kind, "memset"
    if kind in ("cuda_runtime", "cuda_driver"):
        return kind, "sync" if SYNC_RUNTIME_CALLS.match(name) else "host"
    if kind in HOST_KINDS:
        return kind, "communication" if is_communication_host_op(name) else "host"
    if kind == "other" and (cat or "").lower() in SYNC_CATS:
        return kind, "sync"
    return kind, None


@lru_cache(maxsize=4096)
def normalise_collective(name: str) -> str | None:
    """``all_reduce`` from ``allreduce``, ``_allgather_base``, ``ncclDevKernel_AllReduce_...``."""
    lowered = name.lower()
    for prefix in ("ncclkernel_", "nccldevkernel_"):
        if lowered.startswith(prefix):
            lowered = lowered[len(prefix):]
    for pattern, collective in _COLLECTIVES:
        if pattern.search(lowered):
            return collective
    return None


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
    key = dtype.lower().removeprefix("c10::").removeprefix("torch.")
    return DTYPE_BYTES.get(key)
