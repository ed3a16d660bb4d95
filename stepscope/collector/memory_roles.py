"""Which storage belongs to parameters, gradients and optimizer state, by address.

The profiler's ``[memory]`` events carry only an address and a size. Knowing the model and the
optimizer, the collector records the address and size of their tensors' storages; analysis then
labels the allocation that created a storage (same address, same size, in the step it was seen)
as parameters / gradients / optimizer state, the rest being activations and temporaries. This
replaces the categories of the deprecated ``export_memory_timeline``.

Storages, not tensors: a view shares its base's allocation (DDP's bucket views, flattened FSDP
parameters), and the allocator reports allocations, so one row per distinct storage and role.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import torch
from torch import nn

from stepscope.store.schema import MEMORY_ROLES

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


class RoleRecorder:
    """Collects role rows over a recorded window, cheaply enough to run at every recorded step.

    Gradients are re-allocated every step (``zero_grad(set_to_none=True)``), so they are recorded
    at the end of every recorded step (~10 us for 30 parameters). Parameters and optimizer state
    are walked once per trace (a few ms for a small model: too slow for every step, and their
    storages do not move between steps of a plain training loop).
    """

    def __init__(self, model: nn.Module | None, optimizer: torch.optim.Optimizer | None) -> None:
        self.model = model
        self.optimizer = optimizer
        self._params = _named_parameters(model, optimizer)
        self._raw: list[tuple[str, str, int, int, torch.device, int | None]] = []

    @property
    def enabled(self) -> bool:
        return bool(self._params)

    def gradients(self, step: int | None) -> None:
        """Record the gradients' storages as they are now, at the end of ``step``."""
        for name, param in self._params:
            grad = param.grad
            if grad is not None:
                self._record("gradient", name, grad, step)

    def everything(self, step: int | None) -> None:
        """Record parameters, gradients and optimizer state as they are now."""
        self.gradients(step)
        state = self.optimizer.state if self.optimizer is not None else {}
        for name, param in self._params:
            self._record("parameter", name, param, step)
            for key, value in state.get(param, {}).items():
                if isinstance(value, torch.Tensor):
                    self._record("optimizer_state", f"{name}.{key}", value, step)

    def take(self) -> list[RoleRow]:
        """The rows recorded since the last ``take()``, one per (role, storage, step)."""
        rows = [RoleRow(role, name, addr, nbytes, DEVICE_TYPES.get(device.type),
                        device.index if device.type != "cpu" else None, step)
                for role, name, addr, nbytes, device, step in self._raw if addr and nbytes]
        self._raw = []
        return unique_roles(rows)

    def _record(self, role: str, name: str, tensor: torch.Tensor, step: int | None) -> None:
        """Keep a bare tuple (no tensor reference: a kept gradient would change the memory
        being measured); rows are built in ``take()``. Sparse and meta tensors have no single
        storage and are skipped."""
        if tensor.layout is not torch.strided or tensor.is_meta:
            return
        storage = tensor.untyped_storage()
        self._raw.append((role, name, storage.data_ptr(), storage.nbytes(), tensor.device, step))


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


def _named_parameters(model: nn.Module | None,
                      optimizer: torch.optim.Optimizer | None) -> list[tuple[str, torch.Tensor]]:
    """Every parameter of the model and of the optimizer's groups, once, with a name."""
    named: dict[int, tuple[str, torch.Tensor]] = {}
    if model is not None:
        for name, param in model.named_parameters():
            named.setdefault(id(param), (name, param))
    if optimizer is not None:
        for group in optimizer.param_groups:
            for param in group["params"]:
                named.setdefault(id(param), (f"param@{id(param):x}", param))
    return list(named.values())


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
