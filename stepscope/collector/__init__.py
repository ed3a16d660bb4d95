"""The collector: profile real training loops straight into a stepscope store.

``profile`` wraps a training loop in one ``with`` block (``watch=Watch(...)`` adds captures of
slow steps); ``trace_handler`` plugs into a ``torch.profiler.profile`` the user already owns.
Names resolve lazily so that the conversion child process (``stepscope.collector.convert_job``)
starts without importing torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_LAZY = {
    "CollectorError": "stepscope.collector.faults",
    "Profile": "stepscope.collector.session",
    "profile": "stepscope.collector.session",
    "TraceHandler": "stepscope.collector.handler",
    "trace_handler": "stepscope.collector.handler",
    "Watch": "stepscope.collector.watch",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'stepscope.collector' has no attribute {name!r}")
    return getattr(import_module(module), name)
