"""stepscope: where every millisecond and byte of a PyTorch training step goes.

Attributes resolve lazily so that ``import stepscope`` (and the CLI) pay neither for DuckDB nor
for torch until they are used.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "open_store": "stepscope.store.catalog",
    "Store": "stepscope.store.catalog",
    "profile": "stepscope.collector",
    "trace_handler": "stepscope.collector",
    "Watch": "stepscope.collector",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'stepscope' has no attribute {name!r}")
    return getattr(import_module(module), name)
