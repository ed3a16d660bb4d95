"""Which storage belongs to parameters, gradients and optimizer state, by address.

The profiler's ``[memory]`` events carry only an address and a size. Knowing the model and the
optimizer, the collector records the address ranges of their tensors' storages at capture time;
analysis then labels an allocation by the range that contains its address (parameters /
gradients / optimizer state, the rest being activations and temporaries). This replaces the
categories of the deprecated ``export_memory_timeline``.

Storages, not tensors: a view shares its base's allocation (DDP's bucket views, flattened FSDP
parameters), and the allocator reports allocations, so one row per distinct storage and role.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import torch
from torch import nn

from stepscope.store.schema import MEMORY_ROLES

ROLES = ("parameter", "gradient", "optimizer_state")

DEVICE_TYPES = {"cpu": 0, "cuda": 1, "mkldnn": 2, "opengl": 3, "opencl": 4, "ideep": 5,
                "hip": 6, "fpga": 7, "maia": 8, "xla": 9, "vulkan": 10, "metal": 11, "xpu": 12,
                "mps": 13, "meta": 14, "hpu": 15, "ve": 16, "lazy": 17, "ipu": 18, "mtia": 19,
                "privateuseone": 20}
"""c10::DeviceType ordinals: the numbering of ``Device Type`` in the profiler's memory events."""


@dataclass(frozen=True)
class RoleRow:
    """One storage with a role: ``addr`` is its data pointer, ``nbytes`` its size, ``step`` the
    step at whose end it was seen (None: at the end of the trace, step unknown)."""

    role: str
    name: str
    addr: int
    nbytes: int
    device_type: int | None
    device: int | None
    step: int | None


def memory_roles(model: nn.Module | None, optimizer: torch.optim.Optimizer | None,
                 step: int | None = None) -> list[RoleRow]:
    """The storages of the model's parameters and gradients and of the optimizer's state now,
    at the end of ``step``."""
    rows: list[RoleRow] = []
    names: dict[int, str] = {}
    if model is not None:
        for name, param in model.named_parameters():
            names[id(param)] = name
            rows.extend(_storage_row("parameter", name, param, step))
            if param.grad is not None:
                rows.extend(_storage_row("gradient", name, param.grad, step))
    if optimizer is not None:
        for group in optimizer.param_groups:
            for param in group["params"]:
                name = names.get(id(param), f"param@{id(param):x}")
                if model is None:
                    rows.extend(_storage_row("parameter", name, param, step))
                    if param.grad is not None:
                        rows.extend(_storage_row("gradient", name, param.grad, step))
                for key, value in optimizer.state.get(param, {}).items():
                    if isinstance(value, torch.Tensor):
                        rows.extend(_storage_row("optimizer_state", f"{name}.{key}", value, step))
    return unique_roles(rows)


def roles_table(rows: list[RoleRow], source: str) -> pa.Table:
    """``rows`` as a ``memory_roles`` table of trace ``source``."""
    return pa.table(
        {
            "source": pa.array([source] * len(rows), pa.string()).dictionary_encode(),
            "role": pa.array([r.role for r in rows], pa.string()).dictionary_encode(),
            "name": pa.array([r.name for r in rows], pa.string()),
            "addr": pa.array([r.addr for r in rows], pa.int64()),
            "bytes": pa.array([r.nbytes for r in rows], pa.int64()),
            "device_type": pa.array([r.device_type for r in rows], pa.int64()),
            "device": pa.array([r.device for r in rows], pa.int64()),
            "step": pa.array([r.step for r in rows], pa.int64()),
        }
    ).cast(MEMORY_ROLES)


def _storage_row(role: str, name: str, tensor: torch.Tensor, step: int | None) -> list[RoleRow]:
    if tensor.is_sparse or tensor.device.type == "meta":
        return []
    storage = tensor.untyped_storage()
    addr, nbytes = storage.data_ptr(), storage.nbytes()
    if addr == 0 or nbytes == 0:
        return []
    return [RoleRow(role, name, addr, nbytes, DEVICE_TYPES.get(tensor.device.type),
                    tensor.device.index if tensor.device.type != "cpu" else None, step)]


def unique_roles(rows: list[RoleRow]) -> list[RoleRow]:
    """One row per (role, storage, step); the first name seen is kept (tied weights share
    storage)."""
    seen: set[tuple[str, int, int, int | None]] = set()
    out: list[RoleRow] = []
    for row in rows:
        key = (row.role, row.addr, row.nbytes, row.step)
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out
