"""One formatter per unit: how every figure stepscope prints reads, wherever it is printed.

The terminal, Markdown, HTML, JUnit and the gate's messages all format through this module, so
one value never shows as ``12.3 ms`` in one place and ``12.35`` in another.

The precision rule, for durations, sizes, bandwidths and counts: **three significant
digits** after picking the largest unit the value reaches (``812 ns``, ``12.3 us``, ``4.56 ms``,
``1.00 s``; ``512 B``, ``1.50 KiB``, ``3.20 GiB``), never an exponent, thousands separators only
above 999 of the largest unit (``1,234 s``). The value is rounded to three significant digits
*before* the unit is chosen, so 999.6 ns reads ``1.00 us``, not ``1,000 ns``. Percentages have
one decimal (``12.3%``); p-values two significant digits. ``None`` reads ``n/a``.

Units are named as the analyses name them (``ns``, ``bytes``, ``gbps``, ``pct``...):
:data:`FORMATTERS` maps each to its formatter, and :func:`format_value` dispatches on it.

It sits at the top of the package, below both the analyses and the renderers, and imports nothing
from stepscope (a leaf): the analysis layer's messages use it as the tables do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

MISSING = "n/a"
"""What a missing value (``None``) reads as."""

NS_PER_US = 1_000
NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000
KIB, MIB, GIB, TIB = 2**10, 2**20, 2**30, 2**40

_TIME_SCALES = ((NS_PER_S, "s"), (NS_PER_MS, "ms"), (NS_PER_US, "us"), (1, "ns"))
_SIZE_SCALES = ((TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB"), (1, "B"))


def _round3(value: float) -> float:
    """``value`` rounded to three significant digits."""
    return float(f"{value:.3g}")


def significant(value: float) -> str:
    """Three significant digits, no exponent: ``1,234``, ``123``, ``12.3``, ``1.23``, ``0.0123``."""
    rounded = _round3(value)
    size = abs(rounded)
    if size == 0:
        return "0"
    if size >= 100:
        return f"{rounded:,.0f}"
    decimals = 2 - math.floor(math.log10(size))
    return f"{rounded:.{decimals}f}"


def _scaled(value: float, scales: tuple[tuple[int, str], ...]) -> str:
    rounded = _round3(value)
    for scale, suffix in scales:
        if abs(rounded) >= scale:
            return f"{significant(rounded / scale)} {suffix}"
    return f"{significant(rounded)} {scales[-1][1]}"


def duration(ns: float) -> str:
    """Nanoseconds in the largest of s, ms, us, ns that the value reaches: ``4.56 ms``."""
    return _scaled(ns, _TIME_SCALES)


def size(n_bytes: float) -> str:
    """Bytes in binary units (KiB = 1024 B), the largest the value reaches: ``1.50 MiB``."""
    return _scaled(n_bytes, _SIZE_SCALES)


def bandwidth(gbps: float) -> str:
    """GB/s (1e9 bytes per second, the unit of nccl-tests and the copy analysis): ``12.3 GB/s``."""
    return f"{significant(gbps)} GB/s"


def percent(pct: float) -> str:
    """A percentage given in percent (12.3 means 12.3 %): one decimal, ``12.3%``."""
    return f"{pct:.1f}%"


def p_value(p: float) -> str:
    """A p-value, two significant digits: ``0.012``."""
    return f"{p:.2g}"


def count(n: float) -> str:
    """A count: integers with thousands separators (``1,234``), fractions to three digits."""
    if float(n).is_integer():
        return f"{int(n):,}"
    return significant(n)


def number(value: float) -> str:
    """A number without a unit (a SQL result, a ratio): integers with thousands separators, other
    values with three decimals (``1,234.568``), three significant digits below 1 (``0.00123``).
    Kept more precise than the unit formatters: the user chose the column, not stepscope."""
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    if abs(value) >= 1:
        return f"{value:,.3f}"
    return significant(value)


def address(value: int) -> str:
    """A memory address in hex, as allocators and debuggers print it: ``0x7f3a2c000000``."""
    return f"0x{int(value):x}"


def since(ns: float, origin: float) -> str:
    """A time relative to ``origin`` (the run's start): ``+1.23 s``."""
    delta = ns - origin
    return ("-" if delta < 0 else "+") + duration(abs(delta))


NAME_WIDTH = 60
"""Longest name a table cell shows (kernel names run to 2,000 characters); the rest on hover or
with ``--verbose``."""


def short_name(name: str, width: int = NAME_WIDTH) -> str:
    """``name`` cut to ``width`` characters, its start and end kept (``void at::native::...::kernel``):
    C++ kernel names differ mostly at their two ends (namespace and template arguments)."""
    if len(name) <= width:
        return name
    head = (width - 3) * 2 // 3
    return name[:head] + "..." + name[len(name) - (width - 3 - head):]


_TIME_SUFFIXES = ("ts_ns", "start_ns", "end_ns", "arrival_ns", "t0_ns", "t1_ns", "alloc_ns", "free_ns")
"""Keys ending so hold a point in time (epoch ns), not a duration."""


def unit_for_key(key: str) -> str:
    """The unit a value under a JSON or frame key is in, by the analyses' naming: ``*_ns`` a
    duration (``time`` for the points in time of :data:`_TIME_SUFFIXES`), ``bytes``/``*_bytes``,
    ``*_gbps``, ``*_pct``, ``addr``/``*_addr``; a ``name`` is a name; anything else a number."""
    if key == "addr" or key.endswith("_addr"):
        return "addr"
    if key.endswith(_TIME_SUFFIXES) or key in ("ts", "start", "end"):
        return "time"
    if key.endswith("_ns"):
        return "ns"
    if key == "bytes" or key.endswith("_bytes"):
        return "bytes"
    if key.endswith("_gbps"):
        return "gbps"
    if key.endswith("_pct") or "_pct_of_" in key:
        return "pct"
    if key in ("name", "kernel", "op") or key.endswith("_name"):
        return "name"
    return "number"


def for_key(key: str, value: Any, origin: float | None = None, full_names: bool = False) -> str:
    """``value`` under ``key`` in human units (:func:`unit_for_key`): durations, sizes, rates,
    addresses in hex, points in time relative to ``origin`` (the run's start; as a duration
    since the first of them when no origin is known), names shortened unless ``full_names``."""
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(for_key(key, v, origin, full_names) for v in value)
    unit = unit_for_key(key)
    if isinstance(value, str):
        return value if unit != "name" or full_names else short_name(value)
    if not isinstance(value, (int, float)):
        return str(value)
    if unit == "time":
        return since(value, origin) if origin is not None else number(value)
    if unit == "addr":
        return address(value)
    if unit == "name":
        return number(value)
    return FORMATTERS[unit](value)


FORMATTERS: dict[str, Callable[[Any], str]] = {
    "ns": duration,
    "bytes": size,
    "gbps": bandwidth,
    "pct": percent,
    "p": p_value,
    "count": count,
    "number": number,
    "addr": address,
    "text": str,
}
"""Unit name -> formatter. ``ns``, ``bytes`` and ``gbps`` are the analyses' units."""


def format_value(value: Any, unit: str) -> str:
    """``value`` in ``unit`` as text (``n/a`` for None); e.g. ``format_value(4.56e6, "ns")``."""
    if value is None:
        return MISSING
    return FORMATTERS[unit](value)


def format_delta(value: Any, unit: str) -> str:
    """A change in ``unit``, signed: ``+1.20 ms``, ``-512 B``, ``0`` for no change."""
    if value is None:
        return MISSING
    if value == 0:
        return "0"
    text = FORMATTERS[unit](value)
    return text if value < 0 else "+" + text


def signed_percent(pct: float | None) -> str:
    """A relative change in percent, signed: ``+12.3%`` (``n/a`` for None)."""
    return MISSING if pct is None else f"{pct:+.1f}%"
