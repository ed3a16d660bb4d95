"""The collector's metadata inside a Kineto trace, encoded so that Kineto cannot corrupt it.

``torch.profiler.profile.preset_metadata_json(key, value)`` writes ``value`` into the exported
JSON verbatim except for one thing: Kineto rewrites every backslash to a slash (measured on torch
2.13: ``"a\\"b"`` comes out as ``"a/"b"``, ``\\n`` as ``/n``, ``\\u00e9`` as ``/u00e9``). A command
line holding a double quote (``--cfg '{"lr": 1}'``, Hydra overrides) made the whole trace invalid
JSON, and every cycle was dropped. So every string of the metadata, keys included, is
percent-encoded for exactly the characters JSON would escape (``"``, ``\\``, control characters,
lone surrogates) and for ``%`` itself: the JSON text then holds no backslash, everything else
stays readable, and ``decode`` gives back each string exactly (undecodable argv bytes included).
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

KEY = "stepscope"
"""The top-level key of the exported trace that holds the collector's metadata."""

ENCODING = "percent-encoded strings"
"""Marks a value written by ``encode``: ``{"encoding": ENCODING, "metadata": {...}}``."""

_SPECIAL = re.compile(r'[%"\\\x00-\x1f\x7f\ud800-\udfff]+')
_ENCODED = re.compile(r"(?:%[0-9A-F]{2})+")


def _quote(text: str) -> str:
    return _SPECIAL.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode("utf-8", "surrogatepass")), text)


def _unquote(text: str) -> str:
    return _ENCODED.sub(lambda m: bytes.fromhex(m.group().replace("%", "")).decode("utf-8", "surrogatepass"), text)


def _walk(value: Any, convert: Callable[[str], str]) -> Any:
    """``value`` with ``convert`` applied to every string in it, dictionary keys included."""
    if isinstance(value, dict):
        return {convert(str(k)): _walk(v, convert) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_walk(v, convert) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return convert(str(value))


def encode(metadata: dict[str, Any]) -> str:
    """The JSON text to hand to ``preset_metadata_json``: no backslash anywhere in it."""
    # With ensure_ascii=False, json escapes only '"', '\\' and control characters: all quoted here.
    return json.dumps({"encoding": ENCODING, "metadata": _walk(metadata, _quote)}, ensure_ascii=False)


def decode(value: Any) -> Any:
    """The metadata ``encode`` wrote, decoded; any other value (an older trace's) unchanged."""
    if not (isinstance(value, dict) and value.get("encoding") == ENCODING and "metadata" in value):
        return value
    try:
        return _walk(value["metadata"], _unquote)
    except UnicodeDecodeError:  # not written by ``encode``: keep what the trace holds
        return value
