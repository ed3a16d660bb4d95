"""FLOPs of each matrix product, convolution and attention op of a rank, counted once: at ingest, in SQL.

The formulas (one per op, in one registry, :data:`FLOP_OPS`) are written as SQL over the op's
recorded arguments, so the ingest computes every op's FLOPs in DuckDB with no Python pass per
op; the analyses (:mod:`stepscope.analysis.flops`) read the tables. Definitions
(docs/ANALYSIS.md, "FLOPs and MFU"):

``record_shapes=True`` gives every CPU op its inputs' ``Input Dims`` (``Input dims`` before 2021's
Kineto; a list per argument: a
tensor's sizes, ``[]`` for a scalar or None), ``Input type`` and, in newer traces, ``Concrete
Inputs`` (scalar and list arguments as text: stride, padding, ``is_causal``). A multiply-add
is 2 FLOPs.

- **matmul** family: ``mm``, ``addmm``, ``_addmm_activation``, ``bmm``, ``baddbmm``, ``addbmm``,
  ``_scaled_mm``: ``2 x batch x m x k x n`` for ``[.., m, k] @ [.., k, n]`` (a bias adds no
  product). The wrappers ``aten::linear`` (``2 x prod(input[:-1]) x k x n``) and
  ``aten::matmul`` (torch's broadcasting) count only when no leaf inside them was recorded.
- **conv** family: ``aten::convolution`` (every convolution passes through it; its backends
  below are not counted): ``2 x N x C_out x prod(out spatial) x C_in/groups x prod(kernel)``,
  the output size from stride, padding and dilation (``Concrete Inputs``); transposed: ``2 x N x
  prod(in spatial) x C_in x C_out/groups x prod(kernel)``. Where stride and padding were not
  recorded (no ``Concrete Inputs``: torch < 2.1), the output is the input of the next op on the
  thread whose first argument has the convolution's batch, output channels and dimensions (the
  batch norm it feeds), when no larger than the input (a direct convolution's). ``aten::convolution_backward``
  (and torch < 1.11's ``aten::cudnn_convolution_backward``): the forward count once per gradient
  its ``output_mask`` asks for (input, weight); when the mask is not recorded, once per gradient
  op recorded inside it (cuDNN's ``_input``, ``_weight``), else both.
- **attention** family: the SDPA implementations (flash, efficient, cuDNN, math, CPU flash) and
  the kernels' own ops: ``2 x B x H x P x E + 2 x B x H x P x E_v`` with ``P`` the (query, key)
  pairs computed: ``L x S``, or for causal attention the pairs torch's mask keeps (top-left
  aligned: query ``i`` sees keys ``0..i``; bottom-right for ``custom_mask_type`` 2). Backward
  ops: twice the forward (four products instead of two; recomputation inside the kernel is not
  model work and is not counted).

A formula that cannot be applied (shapes missing, inconsistent, or a stride that was not
recorded) gives no FLOPs and the reason; the op is then reported, not counted, unless the trace
gave its own ``flops`` arg (``with_flops=True``).

**Counting once.** Each product is counted at its **leaf**: the op that does it, the outermost
leaf with FLOPs when leaves nest. A **wrapper** (``aten::linear``, ``aten::matmul``,
``aten::conv2d``, ``aten::scaled_dot_product_attention``) counts only when no counted leaf was
recorded inside it on its thread, and never inside an op that counts. As a rule over the
thread's nesting of the ops with FLOPs (ordered by start, longer first, wrappers before leaves;
an op encloses those that start while it runs): a leaf counts unless a leaf encloses it; a
wrapper inside a leaf does not count; a wrapper with a counted leaf inside does not count; any
other wrapper counts unless, when it starts, an enclosing wrapper still counts (one that counts
and has had no counted leaf inside it yet; there is at most one): the recursive ``_chain``, one
level per depth of nesting. The ops of one thread are a call stack, so they nest; ops that
overlap without nesting (which a thread's call stack does not record) are taken as nested.

**Kernel time**: a counted op's compute kernels are those launched (runtime or driver call on
the op's thread, inside the op) while it ran; ``tf32``: one of them is a TF32 kernel
(:data:`TF32_KERNEL`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import duckdb

FAMILIES = ("matmul", "conv", "attention")
"""Op families, in report order (the ``<family>_flops`` keys of the ``mfu`` section)."""

TRACE_DTYPES: Mapping[str, str] = {
    "double": "float64",
    "float": "float32",
    "c10::Half": "float16",
    "c10::BFloat16": "bfloat16",
    "c10::Float8_e4m3fn": "float8_e4m3fn",
    "c10::Float8_e5m2": "float8_e5m2",
    "c10::Float8_e4m3fnuz": "float8_e4m3fnuz",
    "c10::Float8_e5m2fnuz": "float8_e5m2fnuz",
    "signed char": "int8",
}
"""``Input type`` as Kineto writes it -> the torch dtype name the analyses report; an op's dtype is
its first input whose type is one of these."""

TF32_KERNEL = r"tf32|xf32|tensorop_s1688gemm"
"""Kernel names (case-insensitive regular expression) that show a float32 product ran on TF32
tensor cores (:mod:`stepscope.analysis.peaks`)."""

TENSOR_ARGS = 4
"""Arguments whose sizes a formula reads (q, k, v of a backward attention op start at 1)."""
TEXT_ARGS = 15
"""``Concrete Inputs`` a formula reads (the cuDNN attention backward's ``is_causal`` is the 15th)."""


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# ---- SQL building blocks: a figure is a STRUCT(flops HUGEINT, reason VARCHAR) ----
# The formulas read the columns of the stages of RANK_FLOP_OPS: the op's registry row (``a``,
# ``b``: argument indices; ``bhle``, ``causal``, ``mask_type``, ``backward``), the sizes
# ``sz[i + 1]`` of argument ``i`` (NULL unless a tensor with recorded sizes), the ``Concrete
# Inputs`` texts ``c<i>``, and what the stages derive from them (``tensor_reason``: why the
# arguments the formula needs are not tensors of the sizes it needs).

def _ok(value: str) -> str:
    return f"{{'flops': ({value})::HUGEINT, 'reason': NULL::VARCHAR}}"


def _checked(checks: Sequence[tuple[str, str]], body: str) -> str:
    """``body`` unless one of ``checks`` (failing condition, reason) holds first."""
    whens = "".join(f" WHEN {condition} THEN {{'flops': NULL::HUGEINT, 'reason': {reason}}}" for condition, reason in checks)
    return f"(CASE{whens} ELSE {body} END)" if checks else body


def _prod(sizes: str) -> str:
    return f"list_reduce(({sizes})::HUGEINT[], lambda p, q: p * q, 1::HUGEINT)"


def _from(sizes: str, start: int) -> str:
    """``sizes[start:]`` (Python's slice)."""
    return f"list_slice({sizes}, {start + 1}, len({sizes}))"


def _drop_last(sizes: str, count: int) -> str:
    """``sizes[:-count]``."""
    return f"list_slice({sizes}, 1, len({sizes}) - {count})"


def _last(sizes: str, count: int) -> str:
    """``sizes[-count:]``."""
    return f"list_slice({sizes}, greatest(len({sizes}) - {count - 1}, 1), len({sizes}))"


def _text(sizes: str) -> str:
    return f"({sizes})::VARCHAR"


def _flag(text: str) -> str:
    """A bool argument (``"True"``/``"False"``), NULL when not recorded."""
    return f"(CASE {text} WHEN 'True' THEN TRUE WHEN 'False' THEN FALSE END)"


_TENSOR_REASON = (
    "list_filter(list_transform(list_zip(tensors, ndims), lambda t: CASE "
    "WHEN n_dims <= t[1] THEN 'argument ' || t[1] || ' not recorded' "
    "WHEN sz[t[1] + 1] IS NULL THEN 'argument ' || t[1] || ' is not a tensor with recorded sizes' "
    "WHEN t[2] IS NOT NULL AND len(sz[t[1] + 1]) <> t[2] "
    "THEN 'argument ' || t[1] || ' has ' || len(sz[t[1] + 1]) || ' dimensions, expected ' || t[2] END), "
    "lambda r: r IS NOT NULL)[1]")
"""The first of the formula's tensor arguments (``tensors``, of ``ndims`` dimensions where not
NULL) that is not recorded, not a tensor with sizes, or of other dimensions: the reason."""

LIST_ARGS: Mapping[int, str] = {3: "stride", 4: "padding", 5: "dilation"}
"""``Concrete Inputs`` that are integer lists (a convolution's), by index."""


def _list_reason(index: int) -> str:
    """Why list argument ``index`` (``i<index>``: parsed; one entry broadcasts to the convolution's
    spatial rank, as torch accepts) gives no sizes, or NULL."""
    what, shown = LIST_ARGS[index], f"'''' || c{index} || ''''"
    return (f"CASE WHEN c{index} IS NULL THEN {_lit(f'no {what} recorded (Concrete Inputs)')} "
            f"WHEN list_bool_or(list_transform(i{index}, lambda v: v IS NULL)) THEN '{what} ' || {shown} || ' is not a list of integers' "
            f"WHEN len(i{index}) <> 1 AND len(i{index}) <> spatial THEN '{what} ' || {shown} || ' does not have ' || spatial || ' entries' "
            f"END AS {what}_reason")


def _broadcast(index: int) -> str:
    """``i<index>`` broadcast to ``spatial`` entries."""
    return f"(CASE WHEN len(i{index}) = 1 THEN list_transform(range(spatial), lambda r: i{index}[1]) ELSE i{index} END)"


def causal_pairs_sql(queries: str, keys: str, bottom_right: str = "FALSE") -> str:
    """(query, key) pairs a causal mask keeps: top-left aligned (torch's ``is_causal``), query
    ``i`` sees keys ``0..i``; bottom-right aligned, keys ``0..i + keys - queries``. That is
    ``sum over i of clamp(i + 1 + shift, 0, keys)``, in closed form."""
    shift = f"(CASE WHEN {bottom_right} THEN ({keys})::HUGEINT - ({queries}) ELSE 0::HUGEINT END)"

    def visible_up_to(n: str) -> str:  # sum of min(v, keys) for v = 1..n
        m = f"greatest({n}, 0)"
        return (f"(CASE WHEN {m} <= {keys} THEN {m} * ({m} + 1) // 2 "
                f"ELSE ({keys})::HUGEINT * ({keys} + 1) // 2 + ({m} - {keys}) * {keys} END)")

    return f"({visible_up_to(f'({queries}) + {shift}')} - {visible_up_to(shift)})"


def causal_pairs(queries: int, keys: int, bottom_right: bool = False) -> int:
    """:func:`causal_pairs_sql` evaluated for given sizes (the one formula, in SQL)."""
    sql = causal_pairs_sql("$queries::HUGEINT", "$keys::HUGEINT", "$bottom_right")
    row = duckdb.connect().execute(f"SELECT ({sql})::HUGEINT",
                                   {"queries": queries, "keys": keys, "bottom_right": bottom_right}).fetchone()
    assert row is not None
    return int(row[0])


def _conv(spatial: str, x: str = "sz[1]", w: str = "sz[2]") -> str:
    """torch's count: ``2 x N x prod(weight) x prod(spatial)`` where spatial is the output's for a
    convolution and the input's for a transposed one (weight ``[C_out, C_in/g, k..]`` or
    ``[C_in, C_out/g, k..]``)."""
    return f"2::HUGEINT * {x}[1] * {_prod(w)} * {_prod(spatial)}"


_TENSORS = [("tensor_reason IS NOT NULL", "tensor_reason")]
_BATCHED = [*_TENSORS, ("len(sz[1]) < 3 OR len(sz[2]) <> len(sz[1])",
                        f"'input ' || {_text('sz[1]')} || ' and weight ' || {_text('sz[2]')} || ' are not a batched convolution'")]
"""Input and weight are a batched convolution's: ``[N, C, ..]`` and a weight of as many dimensions."""


_NEXT_MISFIT = ("c3 IS NULL AND c4 IS NULL AND out_next IS NOT NULL AND NOT next_fits",
                f"'the next op''s input ' || {_text('next_in')} || ' is larger than the input ' || {_text('sz[1]')} "
                "|| ': not taken as the output, and no stride or padding recorded'")
"""A convolution without stride and padding whose next op's input (``next_in``, ``out_next`` its
spatial sizes: ``_next``) is not a direct convolution's output."""


def _or_next(body: str) -> str:
    """The count from the output the next op's input gives (``next_fits``), where stride and
    padding were not recorded; else ``body``."""
    return f"(CASE WHEN c3 IS NULL AND c4 IS NULL AND next_fits THEN {_ok(_conv('out_next'))} ELSE {body} END)"


_GRADS = ("(CASE WHEN c10 IS NOT NULL THEN len(list_filter(list_slice(string_split(trim(c10, '[]'), ','), 1, 2), "
          "lambda m: trim(m) = 'True')) WHEN grad_ops > 0 THEN grad_ops ELSE 2 END)")
"""The gradients a backward convolution computes (input, weight): per its ``output_mask`` (the
11th argument), else per the gradient ops recorded inside it (``grad_ops``: ``_grads``), else both."""


def _direct_conv(padded: bool) -> str:
    """A (non-transposed) convolution with stride at argument 3, dilation at 5 and the padding at 4
    (``padded``) or none: output spatial sizes ``out_padded``/``out_unpadded`` (``_padded``)."""
    out = "out_padded" if padded else "out_unpadded"
    lists = [(f"{what}_reason IS NOT NULL", f"{what}_reason") for i, what in LIST_ARGS.items() if padded or i != 4]
    return _checked([*lists, (f"list_bool_or(list_transform({out}, lambda o: o <= 0))",
                              f"'output size ' || {_text(out)} || ' is empty'")], _ok(_conv(out)))


@dataclass(frozen=True)
class Formula:
    """One formula of :data:`FLOP_OPS`: its kind (:data:`KINDS`) and parameters, which become the
    op's registry row in SQL: ``tensors`` the arguments it needs as tensors (of ``ndims``
    dimensions where given), ``a``, ``b`` argument indices (for attention ``a`` is q's), ``bhle``
    the attention layout, ``causal``/``mask_type`` where causality is recorded, ``backward``."""

    kind: str
    tensors: tuple[int, ...]
    ndims: tuple[int | None, ...] = ()
    a: int | None = None
    b: int | None = None
    bhle: bool | None = None
    causal: int | None = None
    mask_type: int | None = None
    backward: bool = False


def matmul(a: int, b: int) -> Formula:
    """A product of arguments ``a`` and ``b``: ``2 x batch x m x k x n``."""
    return Formula("product", (a, b), a=a, b=b)


def attention(q: int, layout: str, causal: int | None = None, mask_type: int | None = None,
              backward: bool = False) -> Formula:
    """One attention op: q, k, v at ``q``.. in layout ``"bhle"`` (SDPA: batch, heads, sequence, head
    dim) or ``"blhe"`` (the flash and efficient kernels' own ops); ``causal``: index of the
    ``is_causal`` bool; ``mask_type``: index of ``custom_mask_type`` (0 none, 1 top-left causal, 2
    bottom-right causal) instead; ``backward``: the op computes the gradients (four products per
    pair, not two)."""
    return Formula("attention", (q, q + 1, q + 2), (4, 4, 4), a=q, bhle=layout == "bhle", causal=causal,
                   mask_type=mask_type, backward=backward)


_PRODUCT = _checked([*_TENSORS,
                     ("kind = 'broadcast_matmul' AND mm_clash",
                      f"'batch dimensions of ' || {_text('sz[1]')} || ' and ' || {_text('sz[2]')} || ' do not broadcast'"),
                     ("len(mm_a) < 2 OR len(mm_b) < 2", _lit("a matrix product needs two operands of two dimensions or more")),
                     ("mm_a[-1] <> mm_b[-2]", f"'inner dimensions differ (' || {_text('mm_a')} || ' @ ' || {_text('mm_b')} || ')'")],
                    _ok(f"2::HUGEINT * {_prod(_drop_last('mm_a', 2))} * mm_a[-2] * mm_a[-1] * mm_b[-1]"))
"""``2 x batch x m x k x n`` for ``mm_a = [.., m, k]`` and ``mm_b = [.., k, n]`` (``_broadcast``)."""

KINDS: Mapping[str, str] = {
    "product": _PRODUCT,
    # aten::matmul(a, b) as torch defines it: a vector operand is a matrix of one row (a) or one
    # column (b); batch dimensions broadcast (mm_a, mm_b: the operands after broadcasting)
    "broadcast_matmul": _PRODUCT,
    # aten::linear(input [.., k], weight [n, k], bias): 2 x prod(input[:-1]) x k x n
    "linear": _checked([*_TENSORS, ("sz[1][-1] <> sz[2][2]",
                                    f"'input ' || {_text('sz[1]')} || ' and weight ' || {_text('sz[2]')} || ' do not share k'")],
                       _ok(f"2::HUGEINT * {_prod(_drop_last('sz[1]', 1))} * sz[2][2] * sz[2][1]")),
    # aten::convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    "convolution": _checked([*_BATCHED, _NEXT_MISFIT], _or_next(_checked(
        [(f"{_flag('c6')} IS NULL", _lit("transposed not recorded (Concrete Inputs)"))],
        f"(CASE WHEN {_flag('c6')} THEN {_ok(_conv(_from('sz[1]', 2)))} ELSE {_direct_conv(True)} END)"))),
    # aten::conv<n>d(input, weight, bias, stride, padding, dilation, groups); padding may be
    # "same" (output as large as the input, stride 1) or "valid" (none)
    "conv_wrapper": _checked([*_BATCHED, _NEXT_MISFIT], _or_next(
        f"(CASE trim(coalesce(c4, ''), '''\"') WHEN 'same' THEN {_ok(_conv(_from('sz[1]', 2)))} "
        f"WHEN 'valid' THEN {_direct_conv(False)} ELSE {_direct_conv(True)} END)")),
    # aten::conv_transpose<n>d(input, weight, ...): the count needs only the input and weight
    "conv_transpose_wrapper": _checked(_BATCHED, _ok(_conv(_from("sz[1]", 2)))),
    # aten::convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
    # transposed, output_padding, groups, output_mask): the forward count per gradient asked for
    # (both when the mask is not recorded); the output spatial size is grad_output's
    "convolution_backward": _checked(
        [*_TENSORS, ("len(sz[2]) < 3 OR len(sz[3]) <> len(sz[2]) OR len(sz[1]) <> len(sz[2])",
                     f"'grad ' || {_text('sz[1]')} || ', input ' || {_text('sz[2]')} || ' and weight ' || {_text('sz[3]')} "
                     "|| ' are not a batched convolution'")],
        _ok(_conv(f"(CASE WHEN coalesce({_flag('c7')}, FALSE) THEN {_from('sz[2]', 2)} ELSE {_from('sz[1]', 2)} END)",
                  "sz[2]", "sz[3]") + f" * {_GRADS}")),
    # aten::cudnn_convolution_backward(input, grad_output, weight, padding, stride, dilation, groups,
    # benchmark, deterministic, allow_tf32, output_mask), torch < 1.11: the same count, the output
    # spatial size grad_output's
    "cudnn_convolution_backward": _checked(
        [*_TENSORS, ("len(sz[1]) < 3 OR len(sz[3]) <> len(sz[1]) OR len(sz[2]) <> len(sz[1])",
                     f"'input ' || {_text('sz[1]')} || ', grad ' || {_text('sz[2]')} || ' and weight ' || {_text('sz[3]')} "
                     "|| ' are not a batched convolution'")],
        _ok(_conv(_from("sz[2]", 2), "sz[1]", "sz[3]") + f" * {_GRADS}")),
    # 2 x B x H x P x E + 2 x B x H x P x E_v over the (query, key) pairs P (at_*: _shaped); twice that backward
    "attention": _checked(_TENSORS, _ok("(CASE WHEN backward THEN 2 ELSE 1 END) * (2::HUGEINT * at_b * at_h * at_pairs * at_e "
                                        "+ 2::HUGEINT * at_b * at_h * at_pairs * at_ev)")),
}
"""The SQL of each kind of formula, giving ``STRUCT(flops, reason)``."""


@dataclass(frozen=True)
class FlopOp:
    """An op of a FLOP family and its formula. ``leaf``: the op that does the products (mm,
    addmm, bmm, baddbmm, convolution, the attention kernels' ops); a wrapper (``aten::linear``,
    ``aten::matmul``, ``aten::conv2d``, ``aten::scaled_dot_product_attention``) calls leaves and
    counts only when no leaf inside it was recorded (module docs)."""

    family: str
    formula: Formula
    leaf: bool = True


_FLASH = attention(0, "bhle", causal=4)
_CONV = (0, 1)
FLOP_OPS: dict[str, FlopOp] = {
    "aten::mm": FlopOp("matmul", matmul(0, 1)),
    "aten::addmm": FlopOp("matmul", matmul(1, 2)),
    "aten::_addmm_activation": FlopOp("matmul", matmul(1, 2)),
    "aten::bmm": FlopOp("matmul", matmul(0, 1)),
    "aten::baddbmm": FlopOp("matmul", matmul(1, 2)),
    "aten::addbmm": FlopOp("matmul", matmul(1, 2)),
    "aten::_scaled_mm": FlopOp("matmul", matmul(0, 1)),
    "aten::linear": FlopOp("matmul", Formula("linear", (0, 1), (None, 2)), leaf=False),
    "aten::matmul": FlopOp("matmul", Formula("broadcast_matmul", (0, 1)), leaf=False),
    "aten::convolution": FlopOp("conv", Formula("convolution", _CONV)),
    "aten::convolution_backward": FlopOp("conv", Formula("convolution_backward", (0, 1, 2))),
    "aten::cudnn_convolution_backward": FlopOp("conv", Formula("cudnn_convolution_backward", (0, 1, 2))),
    **{f"aten::conv{n}d": FlopOp("conv", Formula("conv_wrapper", _CONV), leaf=False) for n in (1, 2, 3)},
    **{f"aten::conv_transpose{n}d": FlopOp("conv", Formula("conv_transpose_wrapper", _CONV), leaf=False)
       for n in (1, 2, 3)},
    "aten::scaled_dot_product_attention": FlopOp("attention", attention(0, "bhle", causal=5), leaf=False),
    "aten::_scaled_dot_product_flash_attention": FlopOp("attention", _FLASH),
    "aten::_scaled_dot_product_flash_attention_for_cpu": FlopOp("attention", _FLASH),
    "aten::_scaled_dot_product_efficient_attention": FlopOp("attention", attention(0, "bhle", causal=6)),
    "aten::_scaled_dot_product_cudnn_attention": FlopOp("attention", attention(0, "bhle", causal=6)),
    "aten::_scaled_dot_product_attention_math": FlopOp("attention", attention(0, "bhle", causal=5)),
    "aten::_flash_attention_forward": FlopOp("attention", attention(0, "blhe", causal=8)),
    "aten::_efficient_attention_forward": FlopOp("attention", attention(0, "blhe", mask_type=9)),
    "aten::_scaled_dot_product_flash_attention_backward":
        FlopOp("attention", attention(1, "bhle", causal=11, backward=True)),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward":
        FlopOp("attention", attention(1, "bhle", causal=7, backward=True)),
    "aten::_scaled_dot_product_efficient_attention_backward":
        FlopOp("attention", attention(1, "bhle", causal=11, backward=True)),
    "aten::_scaled_dot_product_cudnn_attention_backward":
        FlopOp("attention", attention(1, "bhle", causal=14, backward=True)),
    "aten::_flash_attention_backward": FlopOp("attention", attention(1, "blhe", causal=11, backward=True)),
    "aten::_efficient_attention_backward":
        FlopOp("attention", attention(1, "blhe", mask_type=14, backward=True)),
}
"""Every op of a FLOP family, by name as the trace records it (docs/ANALYSIS.md lists them)."""


# ---- the queries ----

def _value(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]::INTEGER[]"
    return _lit(value) if isinstance(value, str) else str(value)


def _row(name: str, op: FlopOp) -> str:
    f = op.formula
    ndims = f.ndims or (None,) * len(f.tensors)
    return "(" + ", ".join(_value(v) for v in (name, op.family, op.leaf, f.kind, f.tensors, ndims, f.a, f.b, f.bhle,
                                               f.causal, f.mask_type, f.backward)) + ")"


def _registry(families: frozenset[str]) -> str:
    """The ops of :data:`FLOP_OPS` of ``families`` as a relation: one row per op name."""
    return ("(VALUES " + ", ".join(_row(name, op) for name, op in FLOP_OPS.items() if op.family in families)
            + ") AS r(name, family, leaf, kind, tensors, ndims, a, b, bhle, causal, mask_type, backward)")


def _figure(families: frozenset[str]) -> str:
    """One CASE over the kinds of the ops of ``families``, each distinct formula once."""
    used = {op.formula.kind for op in FLOP_OPS.values() if op.family in families}
    kinds: dict[str, list[str]] = {}
    for kind, sql in KINDS.items():
        if kind in used:
            kinds.setdefault(sql, []).append(kind)
    return "CASE " + " ".join(f"WHEN kind IN ({', '.join(_lit(k) for k in names)}) THEN {sql}"
                              for sql, names in kinds.items()) + " END"


def _sizes(index: int) -> str:
    arg = f"dims[{index + 1}]"
    return (f"CASE WHEN len(dims) > {index} AND json_type({arg}) = 'ARRAY' AND json_array_length({arg}) > 0 "
            f"AND list_bool_and(list_transform(json_extract({arg}, '$[*]'), lambda d: json_type(d) IN ('BIGINT', 'UBIGINT'))) "
            f"THEN TRY_CAST({arg} AS BIGINT[]) END")


def _concrete(index: int) -> str:
    arg = f"concrete[{index + 1}]"
    return f"(CASE WHEN json_type({arg}) = 'VARCHAR' AND ({arg} ->> '$') <> '' THEN {arg} ->> '$' END) AS c{index}"


def _int_list(index: int) -> str:
    return (f"list_transform(list_filter(string_split(trim(c{index}, '[]'), ','), lambda v: trim(v) <> ''), "
            f"lambda v: TRY_CAST(trim(v) AS BIGINT)) AS i{index}")


def _out_size(padding: str) -> str:
    """A convolution's output spatial sizes from input, weight, stride, ``padding`` and dilation:
    ``floor((size + 2 p - d (k - 1) - 1) / s) + 1`` (NULL for a stride that is not positive)."""
    num = f"(sz[1][d + 2] + 2 * {padding}[d] - dilation[d] * (sz[2][d + 2] - 1) - 1)"
    return (f"list_transform(range(1, spatial + 1), lambda d: CASE WHEN stride[d] > 0 THEN "
            f"(CASE WHEN {num} >= 0 THEN {num} // stride[d] ELSE -((stride[d] - 1 - {num}) // stride[d]) END) + 1 END)")


_DTYPE = ("list_filter(list_transform(types, lambda t: CASE WHEN json_type(t) = 'VARCHAR' THEN CASE t ->> '$' "
          + " ".join(f"WHEN {_lit(k)} THEN {_lit(v)}" for k, v in TRACE_DTYPES.items())
          + " END END), lambda d: d IS NOT NULL)[1]")

_TEXTS = "[" + ", ".join(f"c{i}" for i in range(TEXT_ARGS)) + "]"

_SAME_THREAD = ("t.source = e.source AND t.pid IS NOT DISTINCT FROM e.pid AND t.tid IS NOT DISTINCT FROM e.tid "
                "AND t.thread_label IS NOT DISTINCT FROM e.thread_label")
"""Event ``e`` is on thread ``t``'s: a thread is its trace, pid and tid, and the label of a pid or tid
written as a string (2021 Kineto writes ``"tid": "1890023232"``), which the store keeps apart."""

_GRAD_OPS = "(" + ", ".join(_lit(f"{name}{part}") for name, op in FLOP_OPS.items()
                            if op.formula.kind == "cudnn_convolution_backward" for part in ("_input", "_weight")) + ")"
"""The gradient ops an old backward convolution calls (``_grads``)."""

FLOP_ROWS = "_rank_flop_rows"
"""The temporary table that holds a trace's FLOP ops once computed (:func:`materialize_flop_ops`):
``rank_flop_ops`` and ``rank_flop_skipped`` both read it, so the big query is planned once."""

_CONV_INPUTS = f"""
    _need AS MATERIALIZED (  -- convolutions without stride and padding: their output may be the next op's input
        SELECT ord, thread, source, pid, tid, thread_label, ts_ns + dur_ns AS end_ns, sz[1][1] AS n, sz[2][1] AS c, len(sz[1]) AS r
        FROM _args WHERE kind IN ('convolution', 'conv_wrapper') AND c3 IS NULL AND c4 IS NULL
         AND len(sz[1]) >= 3 AND len(sz[2]) = len(sz[1])
    ),
    _after AS (  -- the CPU ops on those threads whose first argument is a tensor of 3 dimensions or more
        SELECT thread, ts_ns, shape, shape[1] AS n, shape[2] AS c, len(shape) AS r
        FROM (SELECT t.thread, e.ts_ns, TRY_CAST(coalesce(json_extract(e.args, '$."Input Dims"[0]'),
                                                          json_extract(e.args, '$."Input dims"[0]')) AS BIGINT[]) AS shape
              FROM events e JOIN (SELECT DISTINCT thread, source, pid, tid, thread_label FROM _need) t ON {_SAME_THREAD}
              WHERE e.run = $run AND e.kind = 'cpu_op' AND e.ts_ns IS NOT NULL AND json_valid(e.args))
        WHERE len(shape) >= 3
    ),
    _next AS (  -- the next op's input of the convolution's batch, output channels and dimensions: its output
        SELECT n.ord, a.shape AS next_in FROM _need n ASOF JOIN _after a
          ON a.thread = n.thread AND a.n = n.n AND a.c = n.c AND a.r = n.r AND a.ts_ns >= n.end_ns
    ),
    _grads AS (  -- the gradient ops (cuDNN's _input, _weight) recorded inside an old backward convolution
        SELECT c.ord, count(DISTINCT e.name) AS grad_ops
        FROM (SELECT * FROM _cand WHERE kind = 'cudnn_convolution_backward') c
        JOIN events e ON {_SAME_THREAD.replace("t.", "c.")}
         AND e.ts_ns >= c.ts_ns AND e.ts_ns <= c.ts_ns + c.dur_ns AND e.name IN (c.name || '_input', c.name || '_weight')
        WHERE e.run = $run AND e.kind = 'cpu_op' AND e.name IN {_GRAD_OPS}
        GROUP BY c.ord
    ),"""
"""What the conv family's formulas read besides the arguments (``_args``): the input of the op after a
convolution (``_need`` .. ``_next``: ``next_in``) and the gradient ops recorded inside an old
backward convolution (``_grads``: ``grad_ops``)."""

_SHAPED: Mapping[str, tuple[str, ...]] = {
    "matmul": ("CASE WHEN kind <> 'broadcast_matmul' THEN sz[a + 1] WHEN len(sz[1]) > 1 THEN sz[1] "
               "ELSE list_concat([1::BIGINT], sz[1]) END AS mm_a2",
               "CASE WHEN kind <> 'broadcast_matmul' THEN sz[b + 1] WHEN len(sz[2]) > 1 THEN sz[2] "
               "ELSE list_concat(sz[2], [1::BIGINT]) END AS mm_b2"),
    "conv": ("len(sz[1]) - 2 AS spatial", "list_slice(next_in, 3, len(next_in)) AS out_next",
             *(_int_list(i) for i in LIST_ARGS)),
    "attention": ("sz[a + 1][1] AS at_b", "CASE WHEN bhle THEN sz[a + 1][2] ELSE sz[a + 1][3] END AS at_h",
                  "CASE WHEN bhle THEN sz[a + 1][3] ELSE sz[a + 1][2] END AS at_l", "sz[a + 1][4] AS at_e",
                  "CASE WHEN bhle THEN sz[a + 2][3] ELSE sz[a + 2][2] END AS at_keys", "sz[a + 3][4] AS at_ev",
                  f"{_TEXTS}[causal + 1] AS at_causal", f"{_TEXTS}[mask_type + 1] AS at_mask"),
}
"""Per family, the columns ``_shaped`` adds to the arguments for its formulas (:data:`KINDS`)."""

_SPREAD: Mapping[str, tuple[str, ...]] = {
    "matmul": (f"{_drop_last('mm_a2', 2)} AS mm_batch_a", f"{_drop_last('mm_b2', 2)} AS mm_batch_b"),
    "conv": (*(_list_reason(i) for i in LIST_ARGS),
             "coalesce(list_bool_and(list_transform(range(1, spatial + 1), "
             "lambda d: out_next[d] >= 1 AND out_next[d] <= sz[1][d + 2])), FALSE) AS next_fits",
             *(f"{_broadcast(i)} AS {what}" for i, what in LIST_ARGS.items())),
    "attention": ("CASE WHEN " + _flag("at_causal") + " THEN " + causal_pairs_sql("at_l", "at_keys")
                  + " WHEN at_mask IN ('1', '2') THEN " + causal_pairs_sql("at_l", "at_keys", "at_mask = '2'")
                  + " ELSE at_l::HUGEINT * at_keys END AS at_pairs",),
}
"""Per family, the columns ``_spread`` adds (from ``_shaped``'s)."""

_PADDED: Mapping[str, tuple[str, ...]] = {
    "matmul": tuple(f"list_concat(list_transform(range(greatest(len(mm_batch_a), len(mm_batch_b)) "
                    f"- len(mm_batch_{x})), lambda r: 1::BIGINT), mm_batch_{x}) AS mm_p{x}" for x in "ab"),
    "conv": (f"{_out_size('padding')} AS out_padded",
             f"{_out_size('list_transform(range(spatial), lambda r: 0)')} AS out_unpadded"),
}
"""Per family, the columns ``_padded`` adds (from ``_spread``'s)."""

_BROADCAST = f"""(  -- a product's operands: as recorded, or as aten::matmul broadcasts them
        SELECT *, CASE WHEN kind = 'broadcast_matmul' THEN list_concat(mm_batch, {_last("mm_a2", 2)}) ELSE mm_a2 END AS mm_a,
               CASE WHEN kind = 'broadcast_matmul' THEN list_concat(mm_batch, {_last("mm_b2", 2)}) ELSE mm_b2 END AS mm_b
        FROM (SELECT *, list_transform(list_zip(mm_pa, mm_pb), lambda z: greatest(z[1], z[2])) AS mm_batch,
                     list_bool_or(list_transform(list_zip(mm_pa, mm_pb), lambda z: z[1] <> z[2] AND z[1] <> 1 AND z[2] <> 1))
                       AS mm_clash
              FROM _padded)
    )"""
"""The matmul family's operands after broadcasting (``mm_a``, ``mm_b``, ``mm_clash``)."""


def _added(columns: Mapping[str, tuple[str, ...]], families: frozenset[str]) -> str:
    """``columns``' entries of ``families``, each after a comma (nothing when none)."""
    return "".join(f", {column}" for family in FAMILIES if family in families for column in columns.get(family, ()))


@functools.cache
def materialize_flop_ops(families: frozenset[str] = frozenset(FAMILIES)) -> str:
    """The statement that computes a trace's ``rank_flop_ops`` rows into :data:`FLOP_ROWS` (with the order
    they are stored in, ``ord``): every op of a FLOP family (:data:`FLOP_OPS`) with its FLOPs, whether
    it counts and why not, and the compute kernels it launched (module docs).

    Written for the ops of ``families`` only (all by default): DuckDB binds a statement in time
    ~linear in its text, and the formulas and the columns they read are most of it, so a trace
    whose ops are all products (the common case) binds neither the convolutions' nor attention's
    (0.1 s of CPU per trace). The rows are the same wherever the trace has no op of another
    family (``tests/test_rankstats_flops.py``). Generated once per set of families."""
    if not families or not families <= set(FAMILIES):
        raise ValueError(f"families must be some of {FAMILIES}, not {sorted(families)}")
    conv = "conv" in families
    texts = f", {', '.join(_concrete(i) for i in range(TEXT_ARGS))}" if conv or "attention" in families else ""
    return f"""
CREATE OR REPLACE TEMP TABLE {FLOP_ROWS} AS
WITH RECURSIVE
    _cand AS MATERIALIZED (
        SELECT row_number() OVER (ORDER BY e.source, e.pid, e.tid, e.thread_label, e.ts_ns, e.dur_ns DESC, r.leaf, e.name)
                 AS ord,
               dense_rank() OVER (ORDER BY e.source, e.pid, e.tid, e.thread_label) AS thread,
               e.source, e.pid, e.tid, e.thread_label, e.step, e.name, e.ts_ns, e.dur_ns, r.* EXCLUDE (name),
               CASE WHEN json_valid(e.args) AND json_type(e.args) = 'OBJECT' THEN e.args::JSON END AS doc
        FROM events e JOIN {_registry(families)} ON r.name = e.name
        WHERE e.run = $run AND e.kind = 'cpu_op' AND e.dur_ns IS NOT NULL AND e.ts_ns IS NOT NULL
    ),
    _lists AS (  -- the args parsed once: the lists of arguments (empty where not a list; "Input dims" before
                 -- 2021's Kineto 0.2, which json_transform cannot ask for beside "Input Dims": DuckDB keys ignore case)
                 -- and Kineto's own figure
        SELECT * EXCLUDE (j), coalesce(j."Input Dims", TRY_CAST(json_extract(doc, '$."Input dims"') AS JSON[]), []) AS dims,
               coalesce(j."Input type", []) AS types,
               coalesce(j."Concrete Inputs", []) AS concrete, j.flops AS kineto
        FROM (SELECT *, json_transform(doc, '{{"Input Dims": "JSON[]", "Input type": "JSON[]", "Concrete Inputs": "JSON[]",
                                               "flops": "JSON"}}') AS j FROM _cand)
    ),
    _args AS (
        SELECT * EXCLUDE (doc), len(dims) AS n_dims, [{", ".join(_sizes(i) for i in range(TENSOR_ARGS))}] AS sz{texts},
               {_DTYPE} AS dtype,
               coalesce(json_type(kineto) IN ('BIGINT', 'UBIGINT') AND TRY_CAST(kineto AS HUGEINT) > 0, FALSE) AS has_kineto
        FROM _lists
    ),{_CONV_INPUTS if conv else ""}
    _shaped AS (  -- what the formulas of KINDS read besides the arguments
        SELECT *, {_TENSOR_REASON} AS tensor_reason{_added(_SHAPED, families)}
        FROM _args{" LEFT JOIN _next USING (ord) LEFT JOIN _grads USING (ord)" if conv else ""}
    ),
    _spread AS (SELECT *{_added(_SPREAD, families)} FROM _shaped),
    _padded AS (SELECT *{_added(_PADDED, families)} FROM _spread),
    _broadcast AS {_BROADCAST if "matmul" in families else "(SELECT * FROM _padded)"},
    _figured AS (
        SELECT ord, thread, source, pid, tid, thread_label, step, name, ts_ns, dur_ns, leaf, family, dtype, has_kineto, kineto,
               {_figure(families)} AS fig
        FROM _broadcast
    ),
    _ops AS MATERIALIZED (
        SELECT ord, thread, source, pid, tid, thread_label, step, name, ts_ns, dur_ns, leaf, dtype, family,
               TRY_CAST(CASE WHEN fig.flops IS NOT NULL THEN fig.flops WHEN has_kineto THEN TRY_CAST(kineto AS HUGEINT) END AS BIGINT) AS flops,
               CASE WHEN fig.flops IS NOT NULL THEN 'shapes' WHEN has_kineto THEN 'kineto' END AS flops_source,
               CASE WHEN fig.flops IS NULL AND NOT has_kineto THEN fig.reason END AS figure_reason
        FROM _figured
    ),
    _with AS MATERIALIZED (SELECT *, ts_ns + dur_ns AS end_ns FROM _ops WHERE flops IS NOT NULL),
    _marks AS (
        -- starts and ends of the ops with FLOPs on each thread: an end at an instant closes before
        -- the starts there, except a zero-length op's, which closes right after its own start
        SELECT ord, thread, ts_ns AS t, 1 AS phase, 0 AS closing, 1 AS d FROM _with
        UNION ALL SELECT ord, thread, end_ns, CASE WHEN dur_ns = 0 THEN 1 ELSE 0 END, 1, -1 FROM _with
    ),
    _depth AS (  -- ops with FLOPs open when each starts: its depth
        SELECT ord, closing, sum(d) OVER (PARTITION BY thread ORDER BY t, phase, ord, closing
                                          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS open_before
        FROM _marks
    ),
    _nested AS (
        SELECT w.*, coalesce(dp.open_before, 0) AS depth,
               coalesce(max(CASE WHEN w.leaf THEN w.end_ns END) OVER (
                   PARTITION BY w.thread ORDER BY w.ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) > w.ts_ns,
                   FALSE) AS in_leaf  -- a leaf encloses it
        FROM _with w JOIN _depth dp ON dp.ord = w.ord AND dp.closing = 0
    ),
    _placed AS MATERIALIZED (
        SELECT n.*, leaf AND NOT in_leaf AS counted_leaf,
               CASE WHEN in_leaf THEN last_value(CASE WHEN leaf AND NOT in_leaf THEN name END IGNORE NULLS) OVER (
                   PARTITION BY thread ORDER BY ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) END AS inside_leaf,
               first_value(CASE WHEN leaf AND NOT in_leaf THEN ord END IGNORE NULLS) OVER (
                   PARTITION BY thread ORDER BY ord ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING) AS next_leaf,
               first_value(CASE WHEN leaf AND NOT in_leaf THEN ts_ns END IGNORE NULLS) OVER (
                   PARTITION BY thread ORDER BY ord ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING) AS next_leaf_ns
        FROM _nested n
    ),
    _wrappers AS MATERIALIZED (  -- wrappers outside every leaf: the first counted leaf inside, the last one's name, the parent
        SELECT w.ord, w.name, p.ord AS parent_ord,
               CASE WHEN w.next_leaf_ns < w.end_ns THEN w.next_leaf END AS first_leaf,
               CASE WHEN w.next_leaf_ns < w.end_ns THEN l.name END AS last_leaf
        FROM (SELECT * FROM _placed WHERE NOT leaf AND NOT in_leaf) w
        ASOF LEFT JOIN (SELECT thread, ts_ns, name FROM _placed WHERE counted_leaf) l
          ON l.thread = w.thread AND w.end_ns > l.ts_ns
        ASOF LEFT JOIN _placed p ON p.thread = w.thread AND p.depth = w.depth - 1 AND p.ord < w.ord
    ),
    _chain AS (
        -- down each thread's nest of wrappers: whether a wrapper counted when it started (no
        -- enclosing wrapper still counting then: one that counted and had no counted leaf inside
        -- it yet; at most one is) and which one still counted (alive_*)
        SELECT ord, first_leaf, name, TRUE AS counted0, NULL::BIGINT AS alive_ord,
               NULL::BIGINT AS alive_first, NULL::VARCHAR AS alive_name
        FROM _wrappers WHERE parent_ord IS NULL
        UNION ALL
        SELECT x.ord, x.first_leaf, x.name, NOT p_alive AND NOT a_alive,
               CASE WHEN p_alive THEN p_ord WHEN a_alive THEN alive_ord END,
               CASE WHEN p_alive THEN p_first WHEN a_alive THEN alive_first END,
               CASE WHEN p_alive THEN p_name WHEN a_alive THEN alive_name END
        FROM (SELECT x.*, p.ord AS p_ord, p.first_leaf AS p_first, p.name AS p_name, p.alive_ord, p.alive_first,
                     p.alive_name, p.counted0 AND coalesce(p.first_leaf > x.ord, TRUE) AS p_alive,
                     p.alive_ord IS NOT NULL AND coalesce(p.alive_first > x.ord, TRUE) AS a_alive
              FROM _chain p JOIN _wrappers x ON x.parent_ord = p.ord) x
    ),
    _verdict AS MATERIALIZED (
        SELECT l.ord,
               CASE WHEN l.in_leaf THEN FALSE WHEN l.leaf THEN TRUE ELSE c.counted0 AND w.first_leaf IS NULL END AS counted,
               CASE WHEN l.in_leaf THEN 'inside ' || l.inside_leaf || ', which counts these products'
                    WHEN l.leaf THEN NULL
                    WHEN w.first_leaf IS NOT NULL THEN 'a wrapper: ' || w.last_leaf || ' inside it counts'
                    WHEN NOT c.counted0 THEN 'inside ' || c.alive_name || ', which counts these products' END AS reason
        FROM _placed l LEFT JOIN _chain c ON c.ord = l.ord LEFT JOIN _wrappers w ON w.ord = l.ord
    ),
    _counted AS MATERIALIZED (SELECT o.ord, o.thread, o.ts_ns, o.end_ns FROM _with o JOIN _verdict v ON v.ord = o.ord WHERE v.counted),
    _threads AS (SELECT DISTINCT thread, source, pid, tid, thread_label FROM _with),
    _in_op AS (  -- runtime and driver calls on a counted op's thread while it ran
        SELECT c.ord, l.source, l.correlation
        FROM (SELECT t.thread, e.source, e.ts_ns, e.correlation FROM events e
              JOIN _threads t ON {_SAME_THREAD}
              WHERE e.run = $run AND e.kind IN ('cuda_runtime', 'cuda_driver') AND e.correlation IS NOT NULL) l
        ASOF JOIN _counted c ON c.thread = l.thread AND l.ts_ns >= c.ts_ns
        WHERE l.ts_ns <= c.end_ns
    ),
    _hit AS (
        SELECT i.ord, sum(k.dur_ns)::BIGINT AS gpu_ns, count(*) AS kernels,
               bool_or(regexp_matches(k.name, {_lit(TF32_KERNEL)}, 'i')) AS tf32
        FROM _in_op i JOIN events k ON k.source = i.source AND k.correlation = i.correlation
        WHERE k.run = $run AND k.kind = 'kernel' AND k.category = 'compute' AND k.dur_ns IS NOT NULL
        GROUP BY i.ord
    )
SELECT o.ord, o.source, o.pid, o.tid, o.step, o.name, o.family, o.leaf, o.ts_ns, o.dur_ns, o.flops, o.flops_source,
       o.dtype, coalesce(v.counted, FALSE) AS counted, coalesce(v.reason, o.figure_reason) AS reason,
       CASE WHEN v.counted THEN coalesce(h.gpu_ns, 0) END AS gpu_ns,
       CASE WHEN v.counted THEN coalesce(h.kernels, 0) END AS kernels, coalesce(h.tf32, FALSE) AS tf32
FROM _ops o LEFT JOIN _verdict v ON v.ord = o.ord LEFT JOIN _hit h ON h.ord = o.ord
"""

RANK_FLOP_OPS = f"""
SELECT source, pid, tid, step, name, family, leaf, ts_ns, dur_ns, flops, flops_source, dtype, counted, reason, gpu_ns,
       kernels, tf32
FROM {FLOP_ROWS} ORDER BY ord
"""
"""The ``rank_flop_ops`` rows of one trace, as :func:`materialize_flop_ops` computed them."""


SKIPPED_LEAF = "leaf AND flops IS NULL AND NOT counted AND NOT starts_with(coalesce(reason, ''), 'inside ')"
"""A ``rank_flop_ops`` row the count skipped: a leaf whose shapes gave no figure, outside every
counted leaf (MFU's coverage weighs their kernels against the counted ops')."""


def skipped_kernels_query(ops: str, keys: Sequence[str], where: str) -> str:
    """Per ``keys`` (a trace: ``source``; ``rank`` too over a whole run) and family: the product
    leaves whose shapes gave no figure (outside every counted leaf: ``ops`` rows, as
    ``rank_flop_ops`` stores them, filtered by ``where``), and the summed duration of the compute
    kernels that the runtime and driver calls on their threads, while one of them ran, launched
    (each kernel once per family; NULL when they launched none).

    Linear in the calls: a family's skipped ops of a thread are merged into islands (closed
    intervals: ops that share an instant are one island), and each call lies in at most the
    latest island started before it, an as-of join. A join of every call with every op of its
    thread cost 0.2 s of CPU per df_index_resolver rank; an as-of join over the ops themselves
    misses calls when two of them overlap."""
    by = ", ".join(keys)
    same = " AND ".join(f"i.{k} = l.{k}" for k in keys)
    return f"""
WITH skipped AS (
    SELECT {by}, pid, tid, family, ts_ns, ts_ns + dur_ns AS end_ns FROM {ops} WHERE {where} AND {SKIPPED_LEAF}
),
counts AS (SELECT {by}, family, count(*) AS ops FROM skipped GROUP BY {by}, family),
marked AS (
    SELECT *, coalesce(ts_ns > max(end_ns) OVER (PARTITION BY {by}, pid, tid, family ORDER BY ts_ns, end_ns
                                                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), TRUE) AS opens
    FROM skipped
),
islands AS (
    SELECT {by}, family, pid IS NULL AS pid_null, coalesce(pid, 0) AS pid0, tid IS NULL AS tid_null,
           coalesce(tid, 0) AS tid0, min(ts_ns) AS ts_ns, max(end_ns) AS end_ns
    FROM (SELECT *, sum(opens::INTEGER) OVER (PARTITION BY {by}, pid, tid, family ORDER BY ts_ns, end_ns
                                              ROWS UNBOUNDED PRECEDING) AS island FROM marked)
    GROUP BY {by}, family, pid, tid, island
),
calls AS (
    SELECT c.{by.replace(", ", ", c.")}, f.family, c.correlation, c.ts_ns, c.pid IS NULL AS pid_null,
           coalesce(c.pid, 0) AS pid0, c.tid IS NULL AS tid_null, coalesce(c.tid, 0) AS tid0
    FROM events c JOIN (SELECT DISTINCT {by}, family FROM skipped) f USING ({by})
    WHERE c.run = $run AND c.kind IN ('cuda_runtime', 'cuda_driver') AND c.correlation IS NOT NULL
),
launches AS (
    SELECT DISTINCT l.{by.replace(", ", ", l.")}, l.family, l.correlation
    FROM calls l ASOF JOIN islands i ON {same} AND i.family = l.family AND i.pid_null = l.pid_null
     AND i.pid0 = l.pid0 AND i.tid_null = l.tid_null AND i.tid0 = l.tid0 AND l.ts_ns >= i.ts_ns
    WHERE l.ts_ns <= i.end_ns
),
kernels AS (
    SELECT l.{by.replace(", ", ", l.")}, l.family, sum(k.dur_ns)::BIGINT AS kernel_ns
    FROM launches l JOIN events k ON {" AND ".join(f"k.{k} = l.{k}" for k in keys)} AND k.correlation = l.correlation
    WHERE k.run = $run AND k.kind = 'kernel' AND k.category = 'compute' AND k.dur_ns IS NOT NULL
    GROUP BY {", ".join(f"l.{k}" for k in keys)}, l.family
)
SELECT {by}, family, ops, kernel_ns FROM counts LEFT JOIN kernels USING ({by}, family) ORDER BY {by}, family
"""


RANK_FLOP_SKIPPED = skipped_kernels_query(FLOP_ROWS, ("source",), "TRUE")
"""The ``rank_flop_skipped`` rows of one trace: per family, the leaves the count skipped and their
compute kernels' time (what MFU's coverage needs, without reading the trace's events again)."""

RANK_FLOP_TRACES = """
SELECT t.source,
       (SELECT count(*) > 0 FROM (SELECT 1 FROM events WHERE run = $run AND kind = 'cpu_op'
                                  AND (contains(args, '"Input Dims"') OR contains(args, '"Input dims"')) LIMIT 1)) AS shapes,
       (SELECT count(*) > 0 FROM (SELECT 1 FROM events WHERE run = $run AND kind = 'kernel' LIMIT 1)) AS kernels,
       (SELECT count(*) > 0 FROM (
            SELECT 1 FROM events k JOIN events l ON l.source = k.source AND l.correlation = k.correlation
             AND l.run = $run AND l.kind IN ('cuda_runtime', 'cuda_driver')
            WHERE k.run = $run AND k.kind = 'kernel' AND k.category = 'compute' AND k.dur_ns IS NOT NULL LIMIT 1)) AS launches
FROM (SELECT DISTINCT source FROM events WHERE run = $run) t
"""
"""The one ``rank_flop_traces`` row of a trace: whether its CPU ops recorded shapes, whether it has
GPU kernels, and whether a compute kernel of it was launched from a recorded runtime call (the
ranks on which a counted op's kernel time is measured, 0 when it launched none)."""
