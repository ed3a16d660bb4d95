"""The FLOP counting of ``rank_flop_ops`` written again in plain Python: the test's reference.

The ingest applies the formulas and the counting rule in SQL (``stepscope.store.rankstats.flops``);
this module does the same per op in Python, the way the analysis did before the table existed:
a formula per op over its decoded ``args``, a stack walk per thread for counting each product
once, and a loop over the launches for the kernels of the counted ops. Only the op names, their
family and leaf flag come from the registry; every formula and reason is written out here.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from typing import Any

from stepscope.analysis.flop_formulas import FLOP_OPS

DTYPES = {"double": "float64", "float": "float32", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
          "c10::Float8_e4m3fn": "float8_e4m3fn", "c10::Float8_e5m2": "float8_e5m2",
          "c10::Float8_e4m3fnuz": "float8_e4m3fnuz", "c10::Float8_e5m2fnuz": "float8_e5m2fnuz", "signed char": "int8"}
TF32 = re.compile(r"tf32|xf32|tensorop_s1688gemm", re.IGNORECASE)


class Missing(ValueError):
    """The op's arguments do not give its FLOPs."""


class Args:
    def __init__(self, doc: dict[str, Any], next_in: list[int] | None = None, grad_ops: int = 0) -> None:
        dims = doc.get("Input Dims")
        self.dims = (dims if dims is not None else doc.get("Input dims")) or []  # lower case before 2021's Kineto 0.2
        self.concrete = doc.get("Concrete Inputs") or []
        self.next_in = next_in  # the next op's first input (a convolution without stride and padding)
        self.grad_ops = grad_ops  # gradient ops recorded inside an old backward convolution

    def tensor(self, i: int, ndim: int | None = None) -> list[int]:
        if i >= len(self.dims):
            raise Missing(f"argument {i} not recorded")
        shape = self.dims[i]
        if not isinstance(shape, list) or not shape or not all(isinstance(d, int) for d in shape):
            raise Missing(f"argument {i} is not a tensor with recorded sizes")
        if ndim is not None and len(shape) != ndim:
            raise Missing(f"argument {i} has {len(shape)} dimensions, expected {ndim}")
        return shape

    def text(self, i: int) -> str | None:
        value = self.concrete[i] if i < len(self.concrete) else None
        return value if isinstance(value, str) and value != "" else None

    def flag(self, i: int) -> bool | None:
        return {"True": True, "False": False}.get(self.text(i) or "")

    def ints(self, i: int, what: str, rank: int) -> list[int]:
        value = self.text(i)
        if value is None:
            raise Missing(f"no {what} recorded (Concrete Inputs)")
        try:
            items = [int(v) for v in value.strip("[]").split(",") if v.strip()]
        except ValueError:
            raise Missing(f"{what} {value!r} is not a list of integers") from None
        items = items * rank if len(items) == 1 else items
        if len(items) != rank:
            raise Missing(f"{what} {value!r} does not have {rank} entries")
        return items


def product(a: list[int], b: list[int]) -> int:
    if len(a) < 2 or len(b) < 2:
        raise Missing("a matrix product needs two operands of two dimensions or more")
    if a[-1] != b[-2]:
        raise Missing(f"inner dimensions differ ({a} @ {b})")
    return 2 * math.prod(a[:-2]) * a[-2] * a[-1] * b[-1]


def broadcast(args: Args) -> int:
    a, b = args.tensor(0), args.tensor(1)
    a2, b2 = (a if len(a) > 1 else [1, *a]), (b if len(b) > 1 else [*b, 1])
    ba, bb = a2[:-2], b2[:-2]
    n = max(len(ba), len(bb))
    ba, bb = [1] * (n - len(ba)) + ba, [1] * (n - len(bb)) + bb
    if any(x != y and 1 not in (x, y) for x, y in zip(ba, bb)):
        raise Missing(f"batch dimensions of {a} and {b} do not broadcast")
    batch = [max(x, y) for x, y in zip(ba, bb)]
    return product([*batch, *a2[-2:]], [*batch, *b2[-2:]])


def linear(args: Args) -> int:
    x, w = args.tensor(0), args.tensor(1, 2)
    if x[-1] != w[1]:
        raise Missing(f"input {x} and weight {w} do not share k")
    return 2 * math.prod(x[:-1]) * w[1] * w[0]


def batched(args: Args) -> tuple[list[int], list[int]]:
    x, w = args.tensor(0), args.tensor(1)
    if len(x) < 3 or len(w) != len(x):
        raise Missing(f"input {x} and weight {w} are not a batched convolution")
    return x, w


def direct(args: Args, x: list[int], w: list[int], pad: list[int]) -> int:
    n = len(x) - 2
    stride, dil = args.ints(3, "stride", n), args.ints(5, "dilation", n)
    out = [(s + 2 * p - d * (k - 1) - 1) // st + 1 for s, k, st, p, d in zip(x[2:], w[2:], stride, pad, dil)]
    if any(o <= 0 for o in out):
        raise Missing(f"output size {out} is empty")
    return 2 * x[0] * math.prod(w) * math.prod(out)


def from_next(args: Args, x: list[int], w: list[int]) -> int | None:
    """A convolution without stride and padding: its output is the next op's input, when that is
    no larger than the input in every spatial dimension (a direct convolution's)."""
    if args.text(3) is not None or args.text(4) is not None or args.next_in is None:
        return None
    out = args.next_in[2:]
    if not all(1 <= o <= i for o, i in zip(out, x[2:])):
        raise Missing(f"the next op's input {args.next_in} is larger than the input {x}: not taken as the output, "
                      "and no stride or padding recorded")
    return 2 * x[0] * math.prod(w) * math.prod(out)


def convolution(args: Args) -> int:
    x, w = batched(args)
    counted = from_next(args, x, w)
    if counted is not None:
        return counted
    transposed = args.flag(6)
    if transposed is None:
        raise Missing("transposed not recorded (Concrete Inputs)")
    if transposed:
        return 2 * x[0] * math.prod(w) * math.prod(x[2:])
    return direct(args, x, w, args.ints(4, "padding", len(x) - 2))


def conv_wrapper(args: Args) -> int:
    x, w = batched(args)
    counted = from_next(args, x, w)
    if counted is not None:
        return counted
    padding = (args.text(4) or "").strip("'\"")
    if padding == "same":
        return 2 * x[0] * math.prod(w) * math.prod(x[2:])
    return direct(args, x, w, [0] * (len(x) - 2) if padding == "valid" else args.ints(4, "padding", len(x) - 2))


def conv_transpose(args: Args) -> int:
    x, w = batched(args)
    return 2 * x[0] * math.prod(w) * math.prod(x[2:])


def conv_backward(args: Args) -> int:
    grad, x, w = args.tensor(0), args.tensor(1), args.tensor(2)
    if len(x) < 3 or len(w) != len(x) or len(grad) != len(x):
        raise Missing(f"grad {grad}, input {x} and weight {w} are not a batched convolution")
    spatial = x[2:] if args.flag(7) else grad[2:]
    return 2 * x[0] * math.prod(w) * math.prod(spatial) * gradients(args)


def gradients(args: Args) -> int:
    mask = args.text(10)
    if mask is not None:
        return sum(p.strip() == "True" for p in mask.strip("[]").split(",")[:2])
    return args.grad_ops or 2


def cudnn_conv_backward(args: Args) -> int:  # torch < 1.11: (input, grad_output, weight, ..., output_mask)
    x, grad, w = args.tensor(0), args.tensor(1), args.tensor(2)
    if len(x) < 3 or len(w) != len(x) or len(grad) != len(x):
        raise Missing(f"input {x}, grad {grad} and weight {w} are not a batched convolution")
    return 2 * x[0] * math.prod(w) * math.prod(grad[2:]) * gradients(args)


def attention(q: int, bhle: bool, causal: int | None = None, mask: int | None = None, backward: bool = False):
    def formula(args: Args) -> int:
        qs, ks, vs = (args.tensor(q + i, 4) for i in range(3))
        b, h, length, e = qs if bhle else (qs[0], qs[2], qs[1], qs[3])
        keys = ks[2] if bhle else ks[1]
        pairs = length * keys
        if causal is not None and args.flag(causal):
            pairs = sum(min(i + 1, keys) for i in range(length))
        elif mask is not None and args.text(mask) in ("1", "2"):
            shift = keys - length if args.text(mask) == "2" else 0
            pairs = sum(min(max(i + 1 + shift, 0), keys) for i in range(length))
        forward = 2 * b * h * pairs * e + 2 * b * h * pairs * vs[3]
        return 2 * forward if backward else forward
    return formula


FORMULAS = {
    **{n: (lambda args: product(args.tensor(0), args.tensor(1))) for n in ("aten::mm", "aten::bmm", "aten::_scaled_mm")},
    **{n: (lambda args: product(args.tensor(1), args.tensor(2)))
       for n in ("aten::addmm", "aten::_addmm_activation", "aten::baddbmm", "aten::addbmm")},
    "aten::linear": linear, "aten::matmul": broadcast, "aten::convolution": convolution,
    "aten::convolution_backward": conv_backward, "aten::cudnn_convolution_backward": cudnn_conv_backward,
    **{f"aten::conv{n}d": conv_wrapper for n in (1, 2, 3)},
    **{f"aten::conv_transpose{n}d": conv_transpose for n in (1, 2, 3)},
    "aten::scaled_dot_product_attention": attention(0, True, causal=5),
    "aten::_scaled_dot_product_flash_attention": attention(0, True, causal=4),
    "aten::_scaled_dot_product_flash_attention_for_cpu": attention(0, True, causal=4),
    "aten::_scaled_dot_product_efficient_attention": attention(0, True, causal=6),
    "aten::_scaled_dot_product_cudnn_attention": attention(0, True, causal=6),
    "aten::_scaled_dot_product_attention_math": attention(0, True, causal=5),
    "aten::_flash_attention_forward": attention(0, False, causal=8),
    "aten::_efficient_attention_forward": attention(0, False, mask=9),
    "aten::_scaled_dot_product_flash_attention_backward": attention(1, True, causal=11, backward=True),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": attention(1, True, causal=7, backward=True),
    "aten::_scaled_dot_product_efficient_attention_backward": attention(1, True, causal=11, backward=True),
    "aten::_scaled_dot_product_cudnn_attention_backward": attention(1, True, causal=14, backward=True),
    "aten::_flash_attention_backward": attention(1, False, causal=11, backward=True),
    "aten::_efficient_attention_backward": attention(1, False, mask=14, backward=True),
}
assert set(FORMULAS) == set(FLOP_OPS), "the reference names every op of the registry"


def decode(args_text: str | None) -> dict[str, Any]:
    try:
        doc = json.loads(args_text) if args_text else {}
    except ValueError:
        doc = {}
    return doc if isinstance(doc, dict) else {}


def figure(name: str, doc: dict[str, Any], next_in: list[int] | None = None,
           grad_ops: int = 0) -> tuple[int | None, str | None, str | None, str | None]:
    """(flops, flops_source, reason, dtype) of one op from its decoded ``args``."""
    types = doc.get("Input type") or []
    dtype = next((DTYPES[t] for t in types if isinstance(t, str) and t in DTYPES), None)
    try:
        return FORMULAS[name](Args(doc, next_in, grad_ops)), "shapes", None, dtype
    except Missing as exc:
        reason = str(exc)
    kineto = doc.get("flops")
    if isinstance(kineto, int) and not isinstance(kineto, bool) and kineto > 0:
        return kineto, "kineto", None, dtype
    return None, None, reason, dtype


def reference_ops(store: Any, run: str) -> list[dict[str, Any]]:
    """Every op of a FLOP family of ``run`` with its FLOPs, counted once, and its kernels."""
    rows = store.sql("""
        SELECT rank, step, source::VARCHAR AS source, pid, tid, thread_label, name, ts_ns, dur_ns, args FROM events
        WHERE run = $run AND kind = 'cpu_op' AND dur_ns IS NOT NULL AND ts_ns IS NOT NULL AND list_contains($names, name)
    """, {"run": run, "names": list(FLOP_OPS)}).to_pylist()
    none_first = lambda v: (v is not None, v or 0)  # noqa: E731
    rows.sort(key=lambda r: (r["rank"], r["source"], none_first(r["pid"]), none_first(r["tid"]),
                             none_first(r["thread_label"]), r["ts_ns"], -r["dur_ns"], FLOP_OPS[r["name"]].leaf, r["name"]))
    docs = [decode(row.pop("args")) for row in rows]
    context = _context(store, run, rows, docs)
    thread, open_ops = None, []
    for i, row in enumerate(rows):
        key = _thread(row)
        if key != thread:
            thread, open_ops = key, []
        start, end = row["ts_ns"], row["ts_ns"] + row["dur_ns"]
        while open_ops and open_ops[-1][0] <= start:
            open_ops.pop()
        enclosing = [j for e, j in open_ops if end <= e]
        row["flops"], row["flops_source"], row["reason"], row["dtype"] = figure(row["name"], docs[i], *context.get(i, ()))
        row["family"], row["leaf"] = FLOP_OPS[row["name"]].family, FLOP_OPS[row["name"]].leaf
        row["counted"] = row["flops"] is not None
        if row["counted"]:
            counting = [j for j in enclosing if rows[j]["counted"] and (rows[j]["leaf"] or not row["leaf"])]
            if counting:
                row["counted"], row["reason"] = False, f"inside {rows[counting[-1]]['name']}, which counts these products"
            elif row["leaf"]:
                for j in enclosing:
                    rows[j]["counted"], rows[j]["reason"] = False, f"a wrapper: {row['name']} inside it counts"
            open_ops.append((end, i))
    _kernels(store, run, rows)
    for row in rows:
        del row["thread_label"]
    return rows


def _thread(row: dict[str, Any]) -> tuple[Any, ...]:
    return row["rank"], row["source"], row["pid"], row["tid"], row["thread_label"]


def _context(store: Any, run: str, rows: list[dict[str, Any]], docs: list[dict[str, Any]]) -> dict[int, tuple[Any, int]]:
    """Per op index: (the next op's first input, the gradient ops inside it), for the convolutions
    without stride and padding and the old backward convolutions; every CPU op of their threads
    is read and walked in Python."""
    wanted = {}
    for i, row in enumerate(rows):
        args = Args(docs[i])
        if row["name"] in ("aten::convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d") \
                and args.text(3) is None and args.text(4) is None:
            wanted[i] = "next"
        elif row["name"] == "aten::cudnn_convolution_backward":
            wanted[i] = "grads"
    if not wanted:
        return {}
    threads = {_thread(rows[i]) for i in wanted}
    ops: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for op in store.sql("SELECT rank, source::VARCHAR AS source, pid, tid, thread_label, name, ts_ns, args FROM events "
                        "WHERE run = $run AND kind = 'cpu_op' AND ts_ns IS NOT NULL", {"run": run}).to_pylist():
        if _thread(op) in threads:
            op["first"] = (Args(decode(op.pop("args"))).dims or [None])[0]
            ops.setdefault(_thread(op), []).append(op)
    out: dict[int, tuple[Any, int]] = {}
    for i, what in wanted.items():
        row, thread_ops = rows[i], ops[_thread(rows[i])]
        start, end = row["ts_ns"], row["ts_ns"] + row["dur_ns"]
        if what == "grads":
            inside = {op["name"] for op in thread_ops if start <= op["ts_ns"] <= end
                      and op["name"] in (row["name"] + "_input", row["name"] + "_weight")}
            out[i] = (None, len(inside))
            continue
        x, w = Args(docs[i]).dims[:2] if len(Args(docs[i]).dims) >= 2 else ([], [])
        if not (isinstance(x, list) and isinstance(w, list) and len(x) >= 3 and len(w) == len(x)):
            continue
        following = []
        for op in thread_ops:
            first = op["first"]
            if op["ts_ns"] >= end and isinstance(first, list) and len(first) == len(x) \
                    and all(isinstance(d, int) for d in first) and first[:2] == [x[0], w[0]]:
                following.append((op["ts_ns"], first))
        if following:
            out[i] = (min(following, key=lambda f: f[0])[1], 0)
    return out


def _kernels(store: Any, run: str, rows: list[dict[str, Any]]) -> None:
    """``gpu_ns``, ``kernels``, ``tf32``: each compute kernel goes to the counted op on its launch's
    thread that started last at or before the launch, when the launch is inside it."""
    launches = store.sql("""
        SELECT k.rank, l.source::VARCHAR AS source, l.pid, l.tid, l.thread_label, l.ts_ns, k.dur_ns, k.name
        FROM events k JOIN events l ON l.run = k.run AND l.rank = k.rank AND l.source = k.source
         AND l.correlation = k.correlation AND l.kind IN ('cuda_runtime', 'cuda_driver')
        WHERE k.run = $run AND k.kind = 'kernel' AND k.category = 'compute' AND k.dur_ns IS NOT NULL
    """, {"run": run}).to_pylist()
    gpu_ranks = {launch["rank"] for launch in launches}
    counted: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        row["tf32"] = False
        row["gpu_ns"] = row["kernels"] = 0 if row["counted"] and row["rank"] in gpu_ranks else None
        if row["counted"]:
            counted.setdefault(_thread(row), []).append(row)
    starts = {}
    for key, ops in counted.items():
        ops.sort(key=lambda r: r["ts_ns"])
        starts[key] = [r["ts_ns"] for r in ops]
    for launch in launches:
        key = _thread(launch)
        ops = counted.get(key, [])
        i = bisect.bisect_right(starts.get(key, []), launch["ts_ns"]) - 1
        if i >= 0 and launch["ts_ns"] <= ops[i]["ts_ns"] + ops[i]["dur_ns"]:
            ops[i]["gpu_ns"] += launch["dur_ns"]
            ops[i]["kernels"] += 1
            ops[i]["tf32"] = ops[i]["tf32"] or bool(TF32.search(launch["name"]))
