"""Structure-aware mutations of real Kineto traces, drawn by Hypothesis (the fuzz harness's input side).

A case is a small, printable *program*: the seed trace it starts from, the edits to its JSON
document (drop, duplicate and reorder events; a field set to another type or to a number at or
past int64 and double limits; hostile strings; deep nesting; top-level keys removed, retyped or
added; a dangling correlation or flow id; a step annotation inside another; several devices on one
pid), how the text is written (NaN and surrogates spelled raw or escaped), the container (plain,
gzip, gzip cut short or corrupted, several members) and byte-level edits (a bit flipped,
truncation at any structural depth). ``materialize`` turns a program into the file's name and
bytes, deterministically, so a failure Hypothesis shrinks is a short program that replays
anywhere the seed exists (the corpus keeps the bytes themselves: tests/corpus/).

Drawing programs rather than bytes keeps Hypothesis's shrinking meaningful: fewer edits, smaller
indices, the first value of each pool.
"""

from __future__ import annotations

import copy
import gzip
import json
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"

SAMPLE_SEEDS = (
    "sample_traces/gloo-3ranks-even/rank0.pt.trace.json.gz",
    "sample_traces/gloo-3ranks-late/rank1.pt.trace.json.gz",
)
"""Seeds the project recorded itself (always present)."""
SHARED_SEEDS = (
    "hta/trace_compare/base/base.json.gz",
    "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "hta/triton_example/triton_example.json.gz",
    "hta/critical_path/cuda_event_sync/event_sync_trace.json.gz",
    "tracelens/torch_compile_triton/trace.json.gz",
    "hta/trace_file_list/inference_rank_1.json.gz",
    "hta/call_stack/backward_thread.json",
)
"""Small real traces of ../shared/traces (NVIDIA, AMD, CPU-only, Triton, old category names):
small so that a case costs the fixed price of an ingest, not a big trace's parse."""


def seed_paths() -> list[str]:
    """Every seed present here: the samples, plus the shared ones when ../shared is there."""
    seeds = [s for s in SAMPLE_SEEDS if (REPO / s).is_file()]
    if SHARED_TRACES.is_dir():
        seeds += [f"shared:{s}" for s in SHARED_SEEDS if (SHARED_TRACES / s).is_file()]
    return seeds


def seed_file(seed: str) -> Path:
    return SHARED_TRACES / seed[len("shared:"):] if seed.startswith("shared:") else REPO / seed


@lru_cache(maxsize=None)
def _seed_text(seed: str) -> bytes:
    data = seed_file(seed).read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def seed_doc(seed: str) -> Any:
    """A fresh copy of the seed's JSON document (mutations edit it in place)."""
    return json.loads(_seed_text(seed))


# ---- the pools values are drawn from (first entries are what shrinking goes to) ----

INT64_MAX = 2**63 - 1
NEST = "\x00fuzz-nest:"
"""A string value replaced, once serialised, by that many nested arrays (deeper than json.dumps recurses)."""
RAW = "\x00fuzz-raw:"
"""A string value replaced, once serialised, by raw bytes (invalid UTF-8, a number json cannot spell)."""
RAW_BYTES = {
    "surrogate": b'"\xed\xa0\x80"',          # a lone surrogate spelled in UTF-8: invalid UTF-8
    "latin1": b'"caf\xe9"',                  # not UTF-8 at all
    "overflow": b"1e400",                     # beyond double
    "underflow": b"-1e-400",
    "bigexp": b"123456789012345678901234567890.5e10",
    "minus_zero": b"-0",
}

NUMBERS: tuple[Any, ...] = (
    0, -1, 1, INT64_MAX, INT64_MAX + 1, -(2**63), -(2**63) - 1, 2**64, 10**30, -(10**30),
    1.5, -0.0, 5e-324, 1.7976931348623157e308, -1.7976931348623157e308, 9.2e15, 1e16, -1e16,
    float("nan"), float("inf"), float("-inf"), 2**53 + 1, 1e300, -1e300,
    f"{RAW}overflow", f"{RAW}underflow", f"{RAW}bigexp", f"{RAW}minus_zero",
)
STRINGS: tuple[str, ...] = (
    "", "x", 'a"b', "a'b", "back\\slash", "nul\x00inside", "\ud800", "lone \udfff low", "line\nbreak",
    "\t\r\x1f\x7f", "ProfilerStep#", "ProfilerStep#-1", "ProfilerStep#99999999999999999999", "ProfilerStep#x",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "Memcpy HtoD (Pinned -> Device)", "[memory]",
    "\u202eright-to-left", "emoji \U0001f525", "%s%n{0}", "'; DROP TABLE events; --", "nan", "1e999",
    "x" * 1_000_000, f"{RAW}surrogate", f"{RAW}latin1",
)
OTHERS: tuple[Any, ...] = (None, True, False, [], {}, [1, 2], {"a": 1}, f"{NEST}64", f"{NEST}100000")
VALUES: tuple[Any, ...] = (*NUMBERS, *STRINGS, *OTHERS)
"""Every replacement value: numbers at and past the limits, hostile strings, other JSON types."""

EVENT_FIELDS = ("ts", "dur", "name", "ph", "cat", "pid", "tid", "args", "id", "s", "bp")
ARG_FIELDS = ("correlation", "External id", "stream", "device", "Device Id", "Device Type", "bytes", "Bytes",
              "Addr", "Total Allocated", "Total Reserved", "Group size", "Seq", "Process Group Name",
              "Process Group Ranks", "In msg nelems", "Out msg nelems", "Collective name", "dtype",
              "Input Dims", "Input type", "Concrete Inputs", "Ev Idx", "flops", "rank")
TOP_KEYS = ("traceEvents", "deviceProperties", "distributedInfo", "baseTimeNanoseconds", "schemaVersion",
            "displayTimeUnit", "computeProperties", "traceName", "stepscope", "deviceProperties[0]",
            "distributedInfo.rank", "distributedInfo.world_size", "distributedInfo.backend",
            "deviceProperties[0].totalGlobalMem", "deviceProperties[0].numSms", "deviceProperties[0].id",
            "deviceProperties[0].name")
DEPTHS = (1, 2, 3, 5, 8, 64, 1000, 100_000)


# ---- the program ----

@dataclass(frozen=True)
class Case:
    """One mutated input: ``seed``, JSON edits ``ops``, ``spelling`` of the text, ``container``
    (``json``, ``gz``, ``gz-cut``, ``gz-corrupt``, ``gz-multi``, ``gz-name-plain``) with its
    parameter, and byte ``edits``."""

    seed: str
    ops: tuple[tuple[Any, ...], ...]
    spelling: str
    container: tuple[str, int]
    edits: tuple[tuple[str, int, int], ...]

    def describe(self) -> str:
        return (f"Case(seed={self.seed!r}, ops={_short(self.ops)}, spelling={self.spelling!r}, "
                f"container={self.container!r}, edits={self.edits!r})")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 2000 else text[:2000] + "...'"


_index = st.integers(min_value=0, max_value=2**20)
_value = st.sampled_from(range(len(VALUES)))

OPS = st.one_of(
    st.tuples(st.just("drop"), _index, st.integers(1, 50)),
    st.tuples(st.just("duplicate"), _index, st.integers(1, 5)),
    st.tuples(st.just("swap"), _index, _index),
    st.tuples(st.just("reverse"), _index, st.integers(2, 100)),
    st.tuples(st.just("shuffle"), st.integers(0, 2**16)),
    st.tuples(st.just("set_field"), _index, st.sampled_from(EVENT_FIELDS), _value),
    st.tuples(st.just("set_arg"), _index, st.sampled_from(ARG_FIELDS), _value),
    st.tuples(st.just("del_field"), _index, st.sampled_from(EVENT_FIELDS)),
    st.tuples(st.just("negative_dur"), _index, st.integers(1, 10**6)),
    st.tuples(st.just("nest_args"), _index, st.sampled_from(DEPTHS)),
    st.tuples(st.just("top_del"), st.sampled_from(TOP_KEYS)),
    st.tuples(st.just("top_set"), st.sampled_from(TOP_KEYS), _value),
    st.tuples(st.just("top_extra"), st.sampled_from(STRINGS[:12]), _value),
    st.tuples(st.just("replace_doc"), st.sampled_from(range(len(OTHERS) + 3))),
    st.tuples(st.just("dangling_correlation"), _index, st.sampled_from((-1, 0, 10**9, INT64_MAX))),
    st.tuples(st.just("dangling_flow"), _index, st.sampled_from(("s", "f", "t")), _value),
    st.tuples(st.just("nested_step"), _index, st.integers(0, 3)),
    st.tuples(st.just("devices_on_pid"), st.integers(1, 8)),
    st.tuples(st.just("event_not_object"), _index, _value),
    st.tuples(st.just("bulk_duplicate"), st.integers(2, 4)),
)
"""Each edit of the JSON document (indices are taken modulo the events there are)."""

CONTAINERS = st.one_of(
    st.tuples(st.sampled_from(("json", "gz", "json", "gz", "gz-multi", "gz-name-plain")), st.just(0)),
    st.tuples(st.sampled_from(("gz-cut", "gz-corrupt")), _index),
)
"""Mostly whole files: a cut or corrupted gzip is refused before its JSON is read."""
EDITS = st.one_of(
    st.just(()), st.just(()), st.just(()),
    st.tuples(st.tuples(st.sampled_from(("flip", "truncate", "cut_token", "insert", "delete")), _index,
                        st.integers(0, 255))),
)
"""No byte edit in three cases of four (structure-aware edits reach the analyses; bytes mostly the parser)."""


@st.composite
def cases(draw: st.DrawFn, seeds: list[str] | None = None) -> Case:
    """A mutated input: mostly JSON edits, some byte edits, every container."""
    seed = draw(st.sampled_from(seeds or seed_paths()))
    ops = tuple(draw(st.lists(OPS, min_size=0, max_size=4)))
    spelling = draw(st.sampled_from(("compact", "indented", "ascii")))
    container = draw(CONTAINERS)
    edits = draw(EDITS)
    return Case(seed, ops, spelling, container, edits)


# ---- applying a program ----

def _events(doc: Any) -> list[Any] | None:
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        return doc["traceEvents"]
    return None


def _event(events: list[Any], index: int) -> dict[str, Any] | None:
    if not events:
        return None
    event = events[index % len(events)]
    return event if isinstance(event, dict) else None


def _set_path(doc: Any, key: str, value: Any, delete: bool = False) -> None:
    """``key`` as ``a``, ``a.b`` or ``a[0].b`` in the top-level object; missing parents are made."""
    if not isinstance(doc, dict):
        return
    parts = key.replace("[0]", ".0").split(".")
    node: Any = doc
    for part in parts[:-1]:
        if part == "0":
            if not isinstance(node, list):
                return
            if not node:
                node.append({})
            node = node[0]
        else:
            if not isinstance(node, dict):
                return
            node = node.setdefault(part, [] if parts[parts.index(part) + 1] == "0" else {})
    last = parts[-1]
    if last == "0":
        if isinstance(node, list):
            if delete:
                node.clear()
            else:
                node[:1] = [value]
        return
    if isinstance(node, dict):
        if delete:
            node.pop(last, None)
        else:
            node[last] = value


def _steps(events: list[Any]) -> list[dict[str, Any]]:
    return [e for e in events if isinstance(e, dict) and str(e.get("name", "")).startswith("ProfilerStep#")]


def apply_op(doc: Any, op: tuple[Any, ...]) -> Any:
    """Apply one edit; returns the (possibly replaced) document."""
    kind, *p = op
    if kind == "replace_doc":
        choices = [*OTHERS, [{"ph": "X"}], {"traceEvents": {}}, {"traceEvents": None}]
        return copy.deepcopy(choices[p[0] % len(choices)])
    if kind == "top_del":
        _set_path(doc, p[0], None, delete=True)
        return doc
    if kind == "top_set":
        _set_path(doc, p[0], VALUES[p[1]])
        return doc
    if kind == "top_extra":
        if isinstance(doc, dict):
            doc[p[0] or "extra"] = VALUES[p[1]]
        return doc
    events = _events(doc)
    if events is None:
        return doc
    n = len(events)
    if kind == "drop" and n:
        i = p[0] % n
        del events[i:i + p[1]]
    elif kind == "duplicate" and n:
        i = p[0] % n
        events[i:i] = [copy.deepcopy(events[i]) for _ in range(p[1])]
    elif kind == "bulk_duplicate":
        events[:] = [copy.deepcopy(e) for e in events for _ in range(p[0])]
    elif kind == "swap" and n:
        i, j = p[0] % n, p[1] % n
        events[i], events[j] = events[j], events[i]
    elif kind == "reverse" and n:
        i = p[0] % n
        events[i:i + p[1]] = events[i:i + p[1]][::-1]
    elif kind == "shuffle":
        random.Random(p[0]).shuffle(events)
    elif kind == "set_field" and (e := _event(events, p[0])) is not None:
        e[p[1]] = copy.deepcopy(VALUES[p[2]])
    elif kind == "set_arg" and (e := _event(events, p[0])) is not None:
        args = e.get("args")
        if not isinstance(args, dict):
            args = e["args"] = {}
        args[p[1]] = copy.deepcopy(VALUES[p[2]])
    elif kind == "del_field" and (e := _event(events, p[0])) is not None:
        e.pop(p[1], None)
    elif kind == "negative_dur" and (e := _event(events, p[0])) is not None:
        e["dur"] = -p[1]
    elif kind == "nest_args" and (e := _event(events, p[0])) is not None:
        e["args"] = {"nested": f"{NEST}{p[1]}"}
    elif kind == "dangling_correlation":
        gpu = [e for e in events if isinstance(e, dict) and isinstance(e.get("args"), dict)
               and "correlation" in e["args"]]
        if gpu:
            gpu[p[0] % len(gpu)]["args"]["correlation"] = p[1]
    elif kind == "dangling_flow" and (e := _event(events, p[0])) is not None:
        events.append({"ph": p[1], "id": VALUES[p[2]], "pid": e.get("pid"), "tid": e.get("tid"),
                       "ts": e.get("ts"), "cat": "ac2g", "name": "ac2g", "bp": "e"})
    elif kind == "nested_step":
        steps = _steps(events)
        outer = steps[p[0] % len(steps)] if steps else _event(events, p[0])
        if outer is not None:
            inner = copy.deepcopy(outer)
            ts, dur = outer.get("ts"), outer.get("dur")
            if isinstance(ts, (int, float)) and isinstance(dur, (int, float)):
                inner["ts"], inner["dur"] = ts + dur / 4, dur / 2
            inner["name"] = ["ProfilerStep#0", str(outer.get("name")), "ProfilerStep#999", "ProfilerStep#1"][p[1]]
            events.append(inner)
    elif kind == "devices_on_pid":
        pids = [e.get("pid") for e in events if isinstance(e, dict) and e.get("cat") in ("kernel", "Kernel", "gpu_memcpy")]
        target = pids[0] if pids else 0
        k = 0
        for e in events:
            if isinstance(e, dict) and isinstance(e.get("args"), dict) and ("device" in e["args"] or "stream" in e["args"]):
                e["pid"] = target
                e["args"]["device"] = k % p[0]
                k += 1
    elif kind == "event_not_object" and n:
        events[p[0] % n] = copy.deepcopy(VALUES[p[1]])
    return doc


def _dumps(doc: Any, spelling: str) -> bytes:
    """The document as JSON text; the markers become deep nesting and raw bytes."""
    if spelling == "ascii":
        text = json.dumps(doc, ensure_ascii=True).encode()
    else:
        text = json.dumps(doc, ensure_ascii=False, indent=1 if spelling == "indented" else None,
                          separators=None if spelling == "indented" else (",", ":")).encode("utf-8", "surrogatepass")
    if b"\\u0000fuzz-" not in text and b"\x00fuzz-" not in text:
        return text
    for prefix in (b"\\u0000fuzz-", b"\x00fuzz-"):
        while (start := text.find(b'"' + prefix)) >= 0:
            end = text.index(b'"', start + 1)
            marker = text[start + 1 + len(prefix):end].decode()
            kind, _, arg = marker.partition(":")
            raw = b"[" * int(arg) + b"]" * int(arg) if kind == "nest" else RAW_BYTES[arg]
            text = text[:start] + raw + text[end + 1:]
    return text


_STRUCTURAL = re.compile(rb'[{}\[\],:"]')


def _structural_positions(text: bytes) -> list[int]:
    """Where JSON's structure is: a cut at the k-th of these stops the text at some depth."""
    return [m.start() for m in _STRUCTURAL.finditer(text)]


def _gzip(text: bytes) -> bytes:
    return gzip.compress(text, compresslevel=1, mtime=0)


def _contain(text: bytes, container: tuple[str, int]) -> tuple[str, bytes]:
    kind, k = container
    if kind == "json":
        return "trace.json", text
    if kind == "gz-name-plain":
        return "trace.json.gz", text
    data = _gzip(text)
    if kind == "gz-multi":
        half = len(text) // 2
        return "trace.json.gz", _gzip(text[:half]) + _gzip(text[half:])
    if kind == "gz-cut":
        return "trace.json.gz", data[:k % max(1, len(data))]
    if kind == "gz-corrupt":
        i = k % len(data)
        return "trace.json.gz", data[:i] + bytes([data[i] ^ (1 << (k % 8)) or 1]) + data[i + 1:]
    return "trace.json.gz", data


def _edit(data: bytes, edit: tuple[str, int, int]) -> bytes:
    kind, k, b = edit
    if not data:
        return data
    i = k % len(data)
    if kind == "flip":
        return data[:i] + bytes([data[i] ^ (1 << (b % 8))]) + data[i + 1:]
    if kind == "truncate":
        return data[:i]
    if kind == "cut_token":
        positions = _structural_positions(data[:2_000_000]) or [i]
        return data[:positions[k % len(positions)] + (b % 2)]
    if kind == "insert":
        return data[:i] + bytes([b]) + data[i:]
    if kind == "delete":
        return data[:i] + data[i + 1 + b % 16:]
    return data


def materialize(case: Case) -> tuple[str, bytes]:
    """The file name and bytes of a case (deterministic)."""
    doc = seed_doc(case.seed)
    for op in case.ops:
        doc = apply_op(doc, op)
    text = _dumps(doc, case.spelling)
    plain_edits = [e for e in case.edits if e[0] in ("cut_token",)]
    for edit in plain_edits:  # truncation at a structural point: before compression
        text = _edit(text, edit)
    name, data = _contain(text, case.container)
    for edit in case.edits:
        if edit[0] != "cut_token":
            data = _edit(data, edit)
    return name, data

