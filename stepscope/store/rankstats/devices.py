"""Device types as Kineto writes them: the one mapping from ``Device Type`` numbers to names.

``[memory]`` events carry ``Device Type``, the number of PyTorch's ``c10::DeviceType`` enum
(c10/core/DeviceType.h) of the allocator that served them; the store keeps the number
(``memory.device_type``, ``memory_roles.device_type``). Everything that names a device or tells
device memory from host memory (memory peaks and capacity, compare's peak memory, the
dashboard's memory picker) reads this table, so an AMD trace (``Device Type`` 6, HIP) is GPU
memory everywhere, not host memory.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceType:
    """One ``c10::DeviceType``: its number, its name, and whether its memory is an accelerator's."""

    number: int
    name: str
    accelerator: bool


DEVICE_TYPES: tuple[DeviceType, ...] = (
    DeviceType(0, "CPU", False),
    DeviceType(1, "CUDA", True),
    DeviceType(2, "MKLDNN", False),
    DeviceType(3, "OpenGL", True),
    DeviceType(4, "OpenCL", True),
    DeviceType(5, "IDEEP", False),
    DeviceType(6, "HIP", True),
    DeviceType(7, "FPGA", True),
    DeviceType(8, "MAIA", True),
    DeviceType(9, "XLA", True),
    DeviceType(10, "Vulkan", True),
    DeviceType(11, "Metal", True),
    DeviceType(12, "XPU", True),
    DeviceType(13, "MPS", True),
    DeviceType(14, "Meta", False),
    DeviceType(15, "HPU", True),
    DeviceType(16, "VE", True),
    DeviceType(17, "Lazy", False),
    DeviceType(18, "IPU", True),
    DeviceType(19, "MTIA", True),
    DeviceType(20, "PrivateUse1", True),
)
"""``c10::DeviceType`` in enum order (MKLDNN and IDEEP are CPU layouts; Meta tensors hold no data;
8 was ORT/MSNPU in older releases)."""

BY_NUMBER: dict[int, DeviceType] = {d.number: d for d in DEVICE_TYPES}


def device_name(number: int | None) -> str:
    """``HIP`` for 6; ``device type 42`` for a number the enum does not define; ``unknown`` for null."""
    if number is None:
        return "unknown"
    known = BY_NUMBER.get(int(number))
    return known.name if known else f"device type {number}"


def is_accelerator(number: int | None) -> bool:
    """Whether memory of this device type is an accelerator's (GPU, MTIA, ...), not the host's."""
    known = BY_NUMBER.get(int(number)) if number is not None else None
    return bool(known and known.accelerator)


def accelerator_sql(column: str) -> str:
    """SQL: ``column`` (a ``Device Type`` number) is an accelerator's memory."""
    numbers = ", ".join(str(d.number) for d in DEVICE_TYPES if d.accelerator)
    return f"({column} IN ({numbers}))"


def name_sql(column: str) -> str:
    """SQL: the device type's name (as :func:`device_name`)."""
    whens = " ".join(f"WHEN {column} = {d.number} THEN '{d.name}'" for d in DEVICE_TYPES)
    return f"(CASE WHEN {column} IS NULL THEN 'unknown' {whens} ELSE 'device type ' || {column} END)"
