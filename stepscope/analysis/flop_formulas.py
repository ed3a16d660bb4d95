"""FLOPs of one op from the shapes the profiler recorded: one formula per op, in one registry.

``record_shapes=True`` gives every CPU op its inputs' ``Input Dims`` (a list per argument: a
tensor's sizes, ``[]`` for a scalar or None), ``Input type`` and, in newer traces, ``Concrete
Inputs`` (scalar and list arguments as text: stride, padding, ``is_causal``). A multiply-add
is 2 FLOPs. Definitions (docs/ANALYSIS.md, "FLOPs and MFU"):

- **matmul** family: ``mm``, ``addmm``, ``_addmm_activation``, ``bmm``, ``baddbmm``, ``addbmm``,
  ``_scaled_mm``: ``2 x batch x m x k x n`` for ``[.., m, k] @ [.., k, n]`` (a bias adds no
  product). The wrappers ``aten::linear`` (``2 x prod(input[:-1]) x k x n``) and
  ``aten::matmul`` (torch's broadcasting) count only when no leaf inside them was recorded.
- **conv** family: ``aten::convolution`` (every convolution passes through it; its backends
  below are not counted): ``2 x N x C_out x prod(out spatial) x C_in/groups x prod(kernel)``,
  the output size from stride, padding and dilation (``Concrete Inputs``); transposed: ``2 x N x
  prod(in spatial) x C_in x C_out/groups x prod(kernel)``. ``aten::convolution_backward``: the
  forward count once per gradient its ``output_mask`` asks for (input, weight; both when the
  mask is not recorded).
- **attention** family: the SDPA implementations (flash, efficient, cuDNN, math, CPU flash) and
  the kernels' own ops: ``2 x B x H x P x E + 2 x B x H x P x E_v`` with ``P`` the (query, key)
  pairs computed: ``L x S``, or for causal attention the pairs torch's mask keeps (top-left
  aligned: query ``i`` sees keys ``0..i``; bottom-right for ``custom_mask_type`` 2). Backward
  ops: twice the forward (four products instead of two; recomputation inside the kernel is not
  model work and is not counted).

A formula that cannot be applied (shapes missing, inconsistent, or a stride that was not
recorded) raises :class:`NoFigure` with the reason; the op is then reported, not counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

FAMILIES = ("matmul", "conv", "attention")
"""Op families, in report order (the ``<family>_flops`` keys of the ``mfu`` section)."""


class NoFigure(ValueError):
    """The op's recorded arguments do not give its FLOPs; the message says why."""


@dataclass(frozen=True)
class OpArgs:
    """The recorded arguments of one op: ``dims`` (``Input Dims``), ``types`` (``Input type``),
    ``concrete`` (``Concrete Inputs``; empty when the trace predates them)."""

    dims: Sequence[Any]
    types: Sequence[Any] = ()
    concrete: Sequence[Any] = ()

    def tensor(self, index: int, ndim: int | None = None) -> list[int]:
        """The sizes of argument ``index``, a tensor (of ``ndim`` dimensions when given)."""
        if index >= len(self.dims):
            raise NoFigure(f"argument {index} not recorded")
        shape = self.dims[index]
        if not isinstance(shape, list) or not shape or not all(isinstance(d, int) for d in shape):
            raise NoFigure(f"argument {index} is not a tensor with recorded sizes")
        if ndim is not None and len(shape) != ndim:
            raise NoFigure(f"argument {index} has {len(shape)} dimensions, expected {ndim}")
        return shape

    def text(self, index: int) -> str | None:
        """``Concrete Inputs[index]`` as recorded, or None when not recorded (or empty)."""
        if index >= len(self.concrete):
            return None
        value = self.concrete[index]
        return value if isinstance(value, str) and value != "" else None

    def ints(self, index: int, what: str, rank: int) -> list[int]:
        """A list argument such as ``"[2, 2]"``, broadcast to ``rank`` entries (torch accepts one)."""
        value = self.text(index)
        if value is None:
            raise NoFigure(f"no {what} recorded (Concrete Inputs)")
        try:
            items = [int(v) for v in value.strip("[]").split(",") if v.strip()]
        except ValueError:
            raise NoFigure(f"{what} {value!r} is not a list of integers") from None
        if len(items) == 1:
            items *= rank
        if len(items) != rank:
            raise NoFigure(f"{what} {value!r} does not have {rank} entries")
        return items

    def flag(self, index: int) -> bool | None:
        """A bool argument (``"True"``/``"False"``), None when not recorded."""
        value = self.text(index)
        return {"True": True, "False": False}.get(value) if value is not None else None


# ---- matmul family ----


def _product(a: list[int], b: list[int]) -> int:
    """``2 x batch x m x k x n`` for ``a = [.., m, k]`` and ``b = [.., k, n]``."""
    if len(a) < 2 or len(b) < 2:
        raise NoFigure("a matrix product needs two operands of two dimensions or more")
    if a[-1] != b[-2]:
        raise NoFigure(f"inner dimensions differ ({a} @ {b})")
    return 2 * math.prod(a[:-2]) * a[-2] * a[-1] * b[-1]


def matmul(a: int, b: int) -> Callable[[OpArgs], int]:
    """The formula of a product of arguments ``a`` and ``b``."""
    return lambda args: _product(args.tensor(a), args.tensor(b))


def linear(args: OpArgs) -> int:
    """``aten::linear(input [.., k], weight [n, k], bias)``: ``2 x prod(input[:-1]) x k x n``."""
    x, w = args.tensor(0), args.tensor(1, 2)
    if x[-1] != w[1]:
        raise NoFigure(f"input {x} and weight {w} do not share k")
    return 2 * math.prod(x[:-1]) * w[1] * w[0]


def broadcast_matmul(args: OpArgs) -> int:
    """``aten::matmul(a, b)`` as torch defines it: a vector operand is a matrix of one row (``a``)
    or one column (``b``); batch dimensions broadcast."""
    a, b = args.tensor(0), args.tensor(1)
    a2, b2 = (a if len(a) > 1 else [1, *a]), (b if len(b) > 1 else [*b, 1])
    batch_a, batch_b = a2[:-2], b2[:-2]
    width = max(len(batch_a), len(batch_b))
    batch_a, batch_b = [1] * (width - len(batch_a)) + batch_a, [1] * (width - len(batch_b)) + batch_b
    if any(x != y and 1 not in (x, y) for x, y in zip(batch_a, batch_b)):
        raise NoFigure(f"batch dimensions of {a} and {b} do not broadcast")
    batch = [max(x, y) for x, y in zip(batch_a, batch_b)]
    return _product([*batch, *a2[-2:]], [*batch, *b2[-2:]])


# ---- conv family ----


def _conv(x: list[int], w: list[int], out_spatial: list[int], transposed: bool) -> int:
    """torch's count: ``2 x N x prod(weight) x prod(spatial)`` where spatial is the output's for a
    convolution and the input's for a transposed one (weight ``[C_out, C_in/g, k..]`` or
    ``[C_in, C_out/g, k..]``)."""
    spatial = x[2:] if transposed else out_spatial
    return 2 * x[0] * math.prod(w) * math.prod(spatial)


def _batched(args: OpArgs) -> tuple[list[int], list[int]]:
    x, w = args.tensor(0), args.tensor(1)
    if len(x) < 3 or len(w) != len(x):
        raise NoFigure(f"input {x} and weight {w} are not a batched convolution")
    return x, w


def _direct_conv(args: OpArgs, x: list[int], w: list[int], padding: list[int]) -> int:
    """A (non-transposed) convolution with stride at argument 3 and dilation at 5."""
    rank = len(x) - 2
    stride, dilation = args.ints(3, "stride", rank), args.ints(5, "dilation", rank)
    out = [(size + 2 * p - d * (k - 1) - 1) // s + 1
           for size, k, s, p, d in zip(x[2:], w[2:], stride, padding, dilation)]
    if any(o <= 0 for o in out):
        raise NoFigure(f"output size {out} is empty")
    return _conv(x, w, out, False)


def convolution(args: OpArgs) -> int:
    """``aten::convolution(input, weight, bias, stride, padding, dilation, transposed,
    output_padding, groups)``."""
    x, w = _batched(args)
    transposed = args.flag(6)
    if transposed is None:
        raise NoFigure("transposed not recorded (Concrete Inputs)")
    if transposed:
        return _conv(x, w, [], True)
    return _direct_conv(args, x, w, args.ints(4, "padding", len(x) - 2))


def conv_wrapper(args: OpArgs) -> int:
    """``aten::conv<n>d(input, weight, bias, stride, padding, dilation, groups)``; ``padding``
    may be ``"same"`` (output as large as the input, stride 1) or ``"valid"`` (none)."""
    x, w = _batched(args)
    padding = (args.text(4) or "").strip("'\"")
    if padding == "same":
        return _conv(x, w, x[2:], False)
    return _direct_conv(args, x, w, [0] * (len(x) - 2) if padding == "valid" else args.ints(4, "padding", len(x) - 2))


def conv_transpose_wrapper(args: OpArgs) -> int:
    """``aten::conv_transpose<n>d(input, weight, ...)``: the count needs only the input and weight."""
    x, w = _batched(args)
    return _conv(x, w, [], True)


def convolution_backward(args: OpArgs) -> int:
    """``aten::convolution_backward(grad_output, input, weight, bias_sizes, stride, padding,
    dilation, transposed, output_padding, groups, output_mask)``: the forward count per gradient
    asked for; the output spatial size is ``grad_output``'s."""
    grad, x, w = args.tensor(0), args.tensor(1), args.tensor(2)
    if len(x) < 3 or len(w) != len(x) or len(grad) != len(x):
        raise NoFigure(f"grad {grad}, input {x} and weight {w} are not a batched convolution")
    transposed = bool(args.flag(7))
    forward = _conv(x, w, grad[2:], transposed)
    mask = args.text(10)
    wanted = 2 if mask is None else sum(part.strip() == "True" for part in mask.strip("[]").split(",")[:2])
    return forward * wanted


# ---- attention family ----


def causal_pairs(queries: int, keys: int, bottom_right: bool = False) -> int:
    """(query, key) pairs a causal mask keeps: top-left aligned (torch's ``is_causal``), query
    ``i`` sees keys ``0..i``; bottom-right aligned, keys ``0..i + keys - queries``. That is
    ``sum over i of clamp(i + 1 + shift, 0, keys)``, here in closed form."""
    shift = keys - queries if bottom_right else 0

    def visible_up_to(n: int) -> int:  # sum of min(v, keys) for v = 1..n
        n = max(n, 0)
        return n * (n + 1) // 2 if n <= keys else keys * (keys + 1) // 2 + (n - keys) * keys

    return visible_up_to(queries + shift) - visible_up_to(shift)


@dataclass(frozen=True)
class Attention:
    """The formula of one attention op: where q, k, v are, their layout, how causality is recorded.

    ``layout``: ``"bhle"`` (SDPA: batch, heads, sequence, head dim) or ``"blhe"`` (the flash and
    efficient kernels' own ops). ``causal``: index of the ``is_causal`` bool; ``mask_type``: index
    of ``custom_mask_type`` (0 none, 1 top-left causal, 2 bottom-right causal) instead.
    ``backward``: the op computes the gradients (four products per pair, not two).
    """

    q: int
    layout: str
    causal: int | None = None
    mask_type: int | None = None
    backward: bool = False

    def __call__(self, args: OpArgs) -> int:
        q, k, v = (args.tensor(self.q + i, 4) for i in range(3))
        if self.layout == "bhle":
            (b, h, length, e), keys, e_v = q, k[2], v[3]
        else:
            (b, length, h, e), keys, e_v = q, k[1], v[3]
        pairs = length * keys
        if self.causal is not None and args.flag(self.causal):
            pairs = causal_pairs(length, keys)
        elif self.mask_type is not None and args.text(self.mask_type) in ("1", "2"):
            pairs = causal_pairs(length, keys, bottom_right=args.text(self.mask_type) == "2")
        forward = 2 * b * h * pairs * e + 2 * b * h * pairs * e_v
        return 2 * forward if self.backward else forward


# ---- the registry ----


@dataclass(frozen=True)
class FlopOp:
    """An op of a FLOP family and its formula. ``leaf``: the op that does the products (mm,
    addmm, bmm, baddbmm, convolution, the attention kernels' ops); a wrapper (``aten::linear``,
    ``aten::matmul``, ``aten::conv2d``, ``aten::scaled_dot_product_attention``) calls leaves and
    counts only when no leaf inside it was recorded (:mod:`stepscope.analysis.flops`)."""

    family: str
    formula: Callable[[OpArgs], int]
    leaf: bool = True


_FLASH = Attention(0, "bhle", causal=4)
FLOP_OPS: dict[str, FlopOp] = {
    "aten::mm": FlopOp("matmul", matmul(0, 1)),
    "aten::addmm": FlopOp("matmul", matmul(1, 2)),
    "aten::_addmm_activation": FlopOp("matmul", matmul(1, 2)),
    "aten::bmm": FlopOp("matmul", matmul(0, 1)),
    "aten::baddbmm": FlopOp("matmul", matmul(1, 2)),
    "aten::addbmm": FlopOp("matmul", matmul(1, 2)),
    "aten::_scaled_mm": FlopOp("matmul", matmul(0, 1)),
    "aten::linear": FlopOp("matmul", linear, leaf=False),
    "aten::matmul": FlopOp("matmul", broadcast_matmul, leaf=False),
    "aten::convolution": FlopOp("conv", convolution),
    "aten::convolution_backward": FlopOp("conv", convolution_backward),
    **{f"aten::conv{n}d": FlopOp("conv", conv_wrapper, leaf=False) for n in (1, 2, 3)},
    **{f"aten::conv_transpose{n}d": FlopOp("conv", conv_transpose_wrapper, leaf=False) for n in (1, 2, 3)},
    "aten::scaled_dot_product_attention": FlopOp("attention", Attention(0, "bhle", causal=5), leaf=False),
    "aten::_scaled_dot_product_flash_attention": FlopOp("attention", _FLASH),
    "aten::_scaled_dot_product_flash_attention_for_cpu": FlopOp("attention", _FLASH),
    "aten::_scaled_dot_product_efficient_attention": FlopOp("attention", Attention(0, "bhle", causal=6)),
    "aten::_scaled_dot_product_cudnn_attention": FlopOp("attention", Attention(0, "bhle", causal=6)),
    "aten::_scaled_dot_product_attention_math": FlopOp("attention", Attention(0, "bhle", causal=5)),
    "aten::_flash_attention_forward": FlopOp("attention", Attention(0, "blhe", causal=8)),
    "aten::_efficient_attention_forward": FlopOp("attention", Attention(0, "blhe", mask_type=9)),
    "aten::_scaled_dot_product_flash_attention_backward":
        FlopOp("attention", Attention(1, "bhle", causal=11, backward=True)),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward":
        FlopOp("attention", Attention(1, "bhle", causal=7, backward=True)),
    "aten::_scaled_dot_product_efficient_attention_backward":
        FlopOp("attention", Attention(1, "bhle", causal=11, backward=True)),
    "aten::_scaled_dot_product_cudnn_attention_backward":
        FlopOp("attention", Attention(1, "bhle", causal=14, backward=True)),
    "aten::_flash_attention_backward": FlopOp("attention", Attention(1, "blhe", causal=11, backward=True)),
    "aten::_efficient_attention_backward":
        FlopOp("attention", Attention(1, "blhe", mask_type=14, backward=True)),
}
"""Every op of a FLOP family, by name as the trace records it (docs/ANALYSIS.md lists them)."""


def op_flops(name: str, args: OpArgs) -> int:
    """FLOPs of op ``name`` from its recorded arguments; :class:`NoFigure` when they do not say."""
    return FLOP_OPS[name].formula(args)
