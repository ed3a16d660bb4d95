"""FLOPs per op against hand formulas on real shapes, counted once, and MFU by hand on a GPU trace.

The hand side reads each trace's raw JSON and applies the textbook formula per op kind (written
out here, not imported); the analysis side is :mod:`stepscope.analysis.flops` over the store.
"""

from __future__ import annotations

import math
import re
import shutil
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable

import pytest

from stepscope.analysis.absent import Absent
from stepscope.analysis.flop_formulas import causal_pairs
from stepscope.analysis.flops import CPU_ONLY, NO_SHAPES, flop_ops, flops_by_family, mfu_steps
from stepscope.analysis.peaks import TF32_KERNEL, device_peak, peak_dtype
from stepscope.analysis.summary import build_summary
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from tests._intervals import load_trace, to_ns
from tests.conftest import load_raw

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"


def _store(paths: list[Path], tmp: Path, run: str = "r") -> Any:
    report = ingest_paths(paths, tmp, run)
    assert report.ok, report.errors
    return open_store(tmp)


def _cpu_ops(trace: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op" and e.get("name") == name
            and e.get("ph") == "X"]


def _by_name(ops: Any, name: str, counted: bool = True) -> list[int]:
    """FLOPs of the counted (or not counted) ops named ``name``, in time order."""
    return [r["flops"] for r in ops.to_pylist() if r["name"] == name and r["counted"] == counted]


# ---- the hand formulas ----

def hand_mm(a: list[int], b: list[int]) -> int:  # [m, k] @ [k, n]
    return 2 * a[0] * a[1] * b[1]


def hand_bmm(a: list[int], b: list[int]) -> int:  # [B, m, k] @ [B, k, n]
    return 2 * a[0] * a[1] * a[2] * b[2]


def hand_conv(x: list[int], w: list[int], stride: list[int], pad: list[int], dil: list[int]) -> int:
    out = [(x[2 + i] + 2 * pad[i] - dil[i] * (w[2 + i] - 1) - 1) // stride[i] + 1 for i in range(len(x) - 2)]
    return 2 * x[0] * w[0] * math.prod(out) * w[1] * math.prod(w[2:])


def hand_attention(q: list[int], k: list[int], causal: bool) -> int:  # [B, H, L, E], E_v = E
    b, h, length, e = q
    keys = k[2]
    pairs = sum(min(i + 1, keys) for i in range(length)) if causal else length * keys
    return 4 * b * h * pairs * e


def _list(text: str) -> list[int]:
    return [int(v) for v in text.strip("[]").split(",")]


# ---- real shapes: shared GPU traces ----

def test_matmul_family_on_a100_trace(ingested: Callable[[str], Path], shared_traces: Path) -> None:
    """trace_diff/control (A100, float32): every mm, addmm, bmm by its formula; linear and matmul
    (wrappers) never counted; the first bmm checked by hand."""
    path = "hta/trace_diff/control/control.json.gz"
    ops = flop_ops(open_store(ingested(path)), "t")
    raw = load_raw(shared_traces / path)
    for name, formula, a, b in (("aten::mm", hand_mm, 0, 1), ("aten::addmm", hand_mm, 1, 2),
                                ("aten::bmm", hand_bmm, 0, 1)):
        expected = sorted(formula(e["args"]["Input Dims"][a], e["args"]["Input Dims"][b])
                          for e in _cpu_ops(raw, name))
        assert expected and sorted(_by_name(ops, name)) == expected, name
    assert not _by_name(ops, "aten::linear") and not _by_name(ops, "aten::matmul")
    # the wrappers' own figures (counted only where no leaf was recorded) agree with the leaves below them
    linear = sorted(2 * math.prod(e["args"]["Input Dims"][0][:-1]) * math.prod(e["args"]["Input Dims"][1])
                    for e in _cpu_ops(raw, "aten::linear"))
    assert linear and sorted(_by_name(ops, "aten::linear", counted=False)) == linear
    assert all(r["reason"].startswith("a wrapper: aten::") for r in ops.to_pylist() if r["name"] == "aten::linear")
    first_bmm = min(_cpu_ops(raw, "aten::bmm"), key=lambda e: e["ts"])
    assert first_bmm["args"]["Input Dims"][:2] == [[1024, 96, 50], [1024, 50, 8]]
    assert _by_name(ops, "aten::bmm")[0] == 2 * 1024 * 96 * 50 * 8


def test_convolutions_on_mi300_trace(ingested: Callable[[str], Path], shared_traces: Path) -> None:
    """resnet_act_checkpoint (MI300X, bf16): aten::convolution from stride/padding/dilation,
    convolution_backward once per gradient in output_mask; conv2d and the MIOpen op below not
    counted again."""
    path = "tracelens/mi300/resnet_act_checkpoint.json.gz"
    ops = flop_ops(open_store(ingested(path)), "t")
    raw = load_raw(shared_traces / path)
    forward = []
    for e in _cpu_ops(raw, "aten::convolution"):
        dims, concrete = e["args"]["Input Dims"], e["args"]["Concrete Inputs"]
        assert concrete[6] == "False"  # no transposed convolution in this trace
        forward.append(hand_conv(dims[0], dims[1], _list(concrete[3]), _list(concrete[4]), _list(concrete[5])))
    assert forward and sorted(_by_name(ops, "aten::convolution")) == sorted(forward)
    backward = []
    for e in _cpu_ops(raw, "aten::convolution_backward"):
        dims, concrete = e["args"]["Input Dims"], e["args"]["Concrete Inputs"]
        grad, x, w = dims[0], dims[1], dims[2]
        per_gradient = 2 * x[0] * w[0] * math.prod(grad[2:]) * w[1] * math.prod(w[2:])
        backward.append(per_gradient * concrete[10].count("True", 0, concrete[10].rindex(",")))
    assert backward and sorted(_by_name(ops, "aten::convolution_backward")) == sorted(backward)
    # the stem by hand: [10, 3, 224, 224] * [64, 3, 7, 7], stride 2, padding 3: a 112 x 112 output
    first = min(_cpu_ops(raw, "aten::convolution"), key=lambda e: e["ts"])
    assert first["args"]["Input Dims"][:2] == [[10, 3, 224, 224], [64, 3, 7, 7]]
    assert _by_name(ops, "aten::convolution")[0] == 2 * 10 * 64 * 112 * 112 * 3 * 7 * 7
    assert not _by_name(ops, "aten::conv2d") and not _by_name(ops, "aten::miopen_convolution")
    # conv2d's own figure (used only where no convolution was recorded inside it) agrees with its leaf's
    assert sorted(_by_name(ops, "aten::conv2d", counted=False)) == sorted(forward)


def test_flash_attention_on_mi300_inference_trace(ingested: Callable[[str], Path], shared_traces: Path) -> None:
    """xdit_sd_3.5 (MI300X): SDPA's flash op counted from q and k (causal or not, as recorded);
    the wrapper and the flash kernel's own op below it are not."""
    path = "tracelens/inference/xdit_sd_3.5/profile_trace_rank_0.json.gz"
    ops = flop_ops(open_store(ingested(path)), "t")
    raw = load_raw(shared_traces / path)
    expected = []
    for e in _cpu_ops(raw, "aten::_scaled_dot_product_flash_attention"):
        dims, concrete = e["args"]["Input Dims"], e["args"]["Concrete Inputs"]
        expected.append(hand_attention(dims[0], dims[1], concrete[4] == "True"))
    assert sum(1 for e in _cpu_ops(raw, "aten::_scaled_dot_product_flash_attention")
               if e["args"]["Concrete Inputs"][4] == "True") > 0  # the causal case is exercised
    assert expected and sorted(_by_name(ops, "aten::_scaled_dot_product_flash_attention")) == sorted(expected)
    wrappers = [r for r in ops.to_pylist() if r["name"] == "aten::scaled_dot_product_attention"]
    assert wrappers and not any(r["counted"] for r in wrappers)
    # the wrapper's own figure agrees with its leaf's (other flash ops ran without the public wrapper)
    assert not Counter(r["flops"] for r in wrappers) - Counter(expected)
    nested = [r for r in ops.to_pylist() if r["name"] == "aten::_flash_attention_forward"]
    assert nested and not any(r["counted"] for r in nested)
    assert all(r["reason"].startswith("inside aten::_scaled_dot_product_flash_attention") for r in nested)
    # CLIP's causal self-attention, [1, 12, 77, 64]: 77 * 78 / 2 (query, key) pairs
    assert hand_attention([1, 12, 77, 64], [1, 12, 77, 64], True) == 4 * 12 * (77 * 78 // 2) * 64


# ---- real shapes: the project's own CPU traces ----

@pytest.mark.parametrize("folder", ["cpu-transformer", "pp-1f1b-4stages"])
def test_cpu_traces_matmul_and_cpu_flash_attention(folder: str, tmp_path: Path) -> None:
    """The project's CPU recordings: mm/addmm and the CPU flash attention forward and backward
    (causal, backward = twice the forward), each against the hand formula; per family sums."""
    store = _store([SAMPLES / folder], tmp_path / "s")
    ops = flop_ops(store, "r")
    families = {(r["rank"], r["family"]): r for r in flops_by_family(store, "r").to_pylist()}
    for trace_path in sorted((SAMPLES / folder).glob("rank*.pt.trace.json.gz")):
        rank = int(trace_path.name[4:].split(".")[0])
        raw = load_raw(trace_path)
        mine = flop_ops(store, "r", [rank])
        matmul = [hand_mm(e["args"]["Input Dims"][0], e["args"]["Input Dims"][1]) for e in _cpu_ops(raw, "aten::mm")]
        matmul += [hand_mm(e["args"]["Input Dims"][1], e["args"]["Input Dims"][2]) for e in _cpu_ops(raw, "aten::addmm")]
        fwd = [hand_attention(e["args"]["Input Dims"][0], e["args"]["Input Dims"][1], e["args"]["Concrete Inputs"][4] == "True")
               for e in _cpu_ops(raw, "aten::_scaled_dot_product_flash_attention_for_cpu")]
        bwd = [2 * hand_attention(e["args"]["Input Dims"][1], e["args"]["Input Dims"][2],
                                  e["args"]["Concrete Inputs"][7] == "True")
               for e in _cpu_ops(raw, "aten::_scaled_dot_product_flash_attention_for_cpu_backward")]
        assert fwd and bwd
        assert sorted(_by_name(mine, "aten::mm") + _by_name(mine, "aten::addmm")) == sorted(matmul)
        assert sorted(_by_name(mine, "aten::_scaled_dot_product_flash_attention_for_cpu")) == sorted(fwd)
        assert sorted(_by_name(mine, "aten::_scaled_dot_product_flash_attention_for_cpu_backward")) == sorted(bwd)
        assert families[(rank, "matmul")]["flops"] == sum(matmul)
        assert families[(rank, "attention")]["flops"] == sum(fwd) + sum(bwd)
        ops_time = sum(round(e["dur"] * 1000) for name in ("aten::mm", "aten::addmm")
                       for e in _cpu_ops(raw, name))
        assert families[(rank, "matmul")]["time_source"] == "cpu_ops"
        assert abs(families[(rank, "matmul")]["time_ns"] - ops_time) <= len(matmul)  # rounding per op
    assert ops.num_rows > 0


# ---- MFU by hand on a GPU trace ----

def test_mfu_by_hand_on_a100_trace(ingested: Callable[[str], Path], shared_traces: Path) -> None:
    """trace_diff/control (A100-PG509-200, float32 products): per step, FLOPs of the mm/addmm/bmm
    started in the step's CPU window, over the step window (extended to the end of the GPU work
    the step launched). The peak is per op, from the kernels it launched: cuBLAS ran most
    products on CUTLASS's TF32 tensor-core SGEMM (``cutlass_80_tensorop_s1688gemm_*``: A100's
    dense TF32 peak, 156 TFLOP/s) and some small ones on plain SGEMM/GEMV kernels
    (``ampere_sgemm_*``: the FP32 peak, 19.5 TFLOP/s)."""
    path = "hta/trace_diff/control/control.json.gz"
    raw = load_trace(shared_traces / path)
    events = [e for e in raw["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((to_ns(raw, e["ts"]), to_ns(raw, e["ts"]) + round(e["dur"] * 1000), int(e["name"][13:]))
                   for e in events if e["name"].startswith("ProfilerStep#"))
    launches = {e["args"]["correlation"]: to_ns(raw, e["ts"]) for e in events if e.get("cat") == "cuda_runtime"
                and "correlation" in e.get("args", {})}
    launched_on: dict[int, list[tuple[int, str]]] = defaultdict(list)  # tid -> (launch ns, kernel name)
    kernel_names = {e["args"]["correlation"]: e["name"] for e in events if e.get("cat") == "kernel"}
    for e in events:
        if e.get("cat") == "cuda_runtime" and e.get("args", {}).get("correlation") in kernel_names:
            launched_on[e["tid"]].append((to_ns(raw, e["ts"]), kernel_names[e["args"]["correlation"]]))
    gpu_end: dict[int, int] = defaultdict(int)
    flops: dict[int, int] = defaultdict(int)
    ideal_ns: dict[int, float] = defaultdict(float)
    tf32_ops = fp32_ops = 0
    for e in events:
        start = to_ns(raw, e["ts"])
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            launched = launches.get(e["args"].get("correlation"))
            step = next((s for s0, s1, s in steps if launched is not None and s0 <= launched < s1), None)
            if step is not None:
                gpu_end[step] = max(gpu_end[step], start + round(e["dur"] * 1000))
        elif e.get("cat") == "cpu_op" and e["name"] in ("aten::mm", "aten::addmm", "aten::bmm"):
            step = next((s for s0, s1, s in steps if s0 <= start < s1), None)
            dims = e["args"]["Input Dims"]
            if step is not None:
                op = (hand_bmm(dims[0], dims[1]) if e["name"] == "aten::bmm"
                      else hand_mm(*dims[1:3]) if e["name"] == "aten::addmm" else hand_mm(dims[0], dims[1]))
                end = start + round(e["dur"] * 1000)
                names = [n for t, n in launched_on[e["tid"]] if start <= t <= end]
                tf32 = any("tf32" in n or "tensorop_s1688gemm" in n for n in names)
                tf32_ops, fp32_ops = tf32_ops + tf32, fp32_ops + (not tf32)
                flops[step] += op
                ideal_ns[step] += op / ((156.0 if tf32 else 19.5) * 1e3)
    assert tf32_ops > 5 * fp32_ops > 0  # mostly TF32, some FP32
    expected = {}
    previous_end = None
    for s0, s1, step in steps:
        w0 = max(s0, previous_end) if previous_end is not None else s0
        w1 = max(s1, gpu_end[step], w0)
        previous_end = w1 if previous_end is None else max(previous_end, w1)
        expected[step] = (flops[step], w1 - w0, ideal_ns[step] / (w1 - w0))
    rows = mfu_steps(open_store(ingested(path)), "t")
    assert not isinstance(rows, Absent)
    got = {r["step"]: r for r in rows.to_pylist()}
    assert sorted(got) == sorted(expected)
    for step, (step_flops, step_ns, mfu) in expected.items():
        row = got[step]
        assert (row["flops"], row["matmul_flops"], row["step_ns"]) == (step_flops, step_flops, step_ns)
        assert (row["dtype"], row["peak_dtype"]) == ("float32", "fp32+tf32")
        assert row["peak_tflops"] == pytest.approx(step_flops / ideal_ns[step] / 1e3, rel=1e-12)
        assert 19.5 < row["peak_tflops"] < 156.0
        assert row["mfu"] == pytest.approx(mfu, rel=1e-12)
        assert row["achieved_tflops"] == pytest.approx(step_flops / step_ns / 1e3, rel=1e-12)
    # measured: 344.7 GFLOP per step in ~76 ms: about 4.5 TFLOP/s, MFU about 3%
    assert 0.02 < got[1010]["mfu"] < 0.05


def test_mfu_in_the_summary_json(ingested: Callable[[str], Path]) -> None:
    doc = build_summary(open_store(ingested("hta/trace_diff/control/control.json.gz")), "t")
    rows = doc["mfu"]
    assert rows and set(rows[0]) >= {"rank", "step", "flops", "matmul_flops", "conv_flops", "attention_flops",
                                     "step_ns", "achieved_tflops", "peak_tflops", "dtype", "mfu"}
    families = doc["flops_by_family"]
    assert [f["family"] for f in families] == ["matmul"]
    # the kernels of the products ran at ~25 TFLOP/s: beyond A100's FP32 19.5, so TF32 was in use
    assert 19.5 < families[0]["achieved_tflops"] < 156


# ---- abstention ----

def test_cpu_run_has_flops_but_no_mfu(tmp_path: Path) -> None:
    doc = build_summary(_store([SAMPLES / "cpu-transformer"], tmp_path / "s"), "r")
    row = doc["mfu"][0]
    assert row["flops"] > 0 and row["achieved_tflops"] > 0
    assert row["mfu"] is None and row["peak_tflops"] is None
    assert row["absent_reasons"]["mfu"] == CPU_ONLY


def test_unknown_device_has_no_mfu(ingested: Callable[[str], Path]) -> None:
    rows = mfu_steps(open_store(ingested("hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz")), "t")
    assert not isinstance(rows, Absent) and rows.num_rows
    for row in rows.to_pylist():
        assert row["mfu"] is None and "'AMD Radeon Graphics'" in row["absent_reason"]


def test_no_shapes_is_absent(make_trace: Callable[..., Path], tmp_path: Path) -> None:
    """A matmul without Input Dims (record_shapes off) gives no FLOPs: the section is absent; with
    shapes but no product in the step, the step has 0 FLOPs (a fact) and no MFU (a reason)."""
    step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100}
    bare = make_trace("rank0.json", [step, {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                                            "ts": 10, "dur": 5}])
    assert mfu_steps(_store([bare], tmp_path / "a"), "r") == Absent(NO_SHAPES)
    shaped = make_trace("rank1.json", [step, _op("aten::relu", 10, 5, [[4, 4]])])
    row = mfu_steps(_store([shaped], tmp_path / "b"), "r").to_pylist()[0]
    assert (row["flops"], row["mfu"]) == (0, None) and row["absent_reason"] == CPU_ONLY


# ---- op kinds with no real trace here, and the counting rule, on built traces ----

def _op(name: str, ts: float, dur: float, dims: list, types: list | None = None, concrete: list | None = None,
        **args: Any) -> dict[str, Any]:
    a: dict[str, Any] = {"Input Dims": dims, "Input type": types or ["c10::BFloat16"] * len(dims), **args}
    if concrete is not None:
        a["Concrete Inputs"] = concrete
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": a}


def test_built_ops_counted_once(make_trace: Callable[..., Path], tmp_path: Path) -> None:
    """baddbmm; the efficient and math SDPA variants (math's own bmm children not counted again);
    Kineto's ``flops`` arg where shapes say nothing; the leaf counts, not the wrapper (a conv2d
    with Kineto's ``flops`` around a convolution: the convolution counts); a wrapper with nothing
    recorded inside it counts (a linear with shapes alone, a conv2d with only its ``flops``); a
    convolution without Concrete Inputs is reported, not counted."""
    q = [2, 8, 128, 64]
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 1000},
        _op("aten::baddbmm", 10, 5, [[4, 32, 16], [4, 32, 48], [4, 48, 16], [], []]),
        _op("aten::_scaled_dot_product_efficient_attention", 20, 10, [q, q, q, [], [], [], [], []],
            concrete=["", "", "", "", "True", "0.", "True", ""]),
        _op("aten::_efficient_attention_forward", 21, 8, [[2, 128, 8, 64]] * 3,
            concrete=[""] * 9 + ["1"]),
        _op("aten::_scaled_dot_product_attention_math", 40, 20, [q, q, q, [], [], [], [], [], []],
            concrete=["", "", "", "", "0.", "False", "", "", "False"]),
        _op("aten::bmm", 41, 5, [[16, 128, 64], [16, 64, 128]]),
        _op("aten::bmm", 50, 5, [[16, 128, 128], [16, 128, 64]]),
        _op("aten::conv2d", 70, 10, [], flops=123456),
        _op("aten::convolution", 71, 8, [[1, 3, 8, 8], [4, 3, 3, 3], [], [], [], [], [], [], []],
            concrete=["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "1"]),
        _op("aten::convolution", 90, 8, [[1, 3, 8, 8], [4, 3, 3, 3], [], [], [], [], [], [], []]),
        _op("aten::mm", 100, 5, [], flops=4096),
        _op("aten::linear", 110, 10, [[4, 16, 32], [8, 32], [8]]),
        _op("aten::conv2d", 130, 10, [], flops=777),
        _op("aten::linear", 150, 10, [[4, 16, 32], [8, 32], [8]]),
        _op("aten::matmul", 151, 8, [[4, 16, 32], [32, 8]]),
        _op("aten::mm", 152, 5, [[64, 32], [32, 8]]),
    ]
    store = _store([make_trace("rank0.json", events)], tmp_path / "s")
    ops = {(r["name"], r["ts_ns"]): r for r in flop_ops(store, "r").to_pylist()}

    def at(name: str, ts_us: int) -> dict[str, Any]:
        return ops[(name, ts_us * 1000)]

    assert at("aten::baddbmm", 10)["flops"] == 2 * 4 * 32 * 48 * 16 and at("aten::baddbmm", 10)["counted"]
    efficient = at("aten::_scaled_dot_product_efficient_attention", 20)
    assert efficient["counted"] and efficient["flops"] == 4 * 2 * 8 * causal_pairs(128, 128) * 64
    assert not at("aten::_efficient_attention_forward", 21)["counted"]
    math_op = at("aten::_scaled_dot_product_attention_math", 40)
    assert math_op["counted"] and math_op["flops"] == 4 * 2 * 8 * 128 * 128 * 64
    assert not at("aten::bmm", 41)["counted"] and not at("aten::bmm", 50)["counted"]
    conv2d = at("aten::conv2d", 70)
    assert (conv2d["counted"], conv2d["flops"], conv2d["flops_source"]) == (False, 123456, "kineto")
    assert conv2d["reason"] == "a wrapper: aten::convolution inside it counts" and not conv2d["leaf"]
    inner = at("aten::convolution", 71)
    assert inner["flops"] == 2 * 4 * 6 * 6 * 3 * 9 and inner["counted"]
    bare = at("aten::convolution", 90)
    assert (bare["flops"], bare["counted"], bare["reason"]) == (None, False, "transposed not recorded (Concrete Inputs)")
    mm = at("aten::mm", 100)
    assert (mm["counted"], mm["flops"], mm["flops_source"]) == (True, 4096, "kineto")
    alone = at("aten::linear", 110)  # [4, 16, 32] x [8, 32]^T: 64 rows, k 32, n 8
    assert (alone["counted"], alone["flops"], alone["flops_source"]) == (True, 2 * 64 * 32 * 8, "shapes")
    assert at("aten::conv2d", 130)["counted"] and at("aten::conv2d", 130)["flops"] == 777
    nested = [at("aten::linear", 150), at("aten::matmul", 151), at("aten::mm", 152)]
    assert [r["counted"] for r in nested] == [False, False, True]
    assert [r["reason"] for r in nested[:2]] == ["a wrapper: aten::mm inside it counts"] * 2
    assert [r["flops"] for r in nested] == [2 * 64 * 32 * 8] * 3
    step = mfu_steps(store, "r").to_pylist()[0]
    counted = [r for r in ops.values() if r["counted"]]
    assert step["flops"] == sum(r["flops"] for r in counted)
    assert step["attention_flops"] == efficient["flops"] + math_op["flops"]
    assert step["conv_flops"] == 2 * 4 * 6 * 6 * 3 * 9 + 777


# ---- the peak table ----

@pytest.mark.parametrize(("name", "dtype", "column", "tflops"), [
    ("NVIDIA A100-SXM4-80GB", "bfloat16", "bf16", 312.0),
    ("NVIDIA A100-PG509-200", "float32", "fp32", 19.5),
    ("Tesla V100-SXM2-16GB", "float16", "fp16", 125.0),
    ("Tesla V100-SXM2-16GB", "float32", "fp32", 15.7),
    ("Tesla V100-PCIE-32GB", "float16", "fp16", 112.0),
    ("NVIDIA H100 80GB HBM3", "bfloat16", "bf16", 989.4),
    ("NVIDIA H100 PCIe", "bfloat16", "bf16", 756.0),
    ("NVIDIA H100 NVL", "float8_e4m3fn", "fp8", 1670.5),
    ("NVIDIA H200", "bfloat16", "bf16", 989.4),
    ("NVIDIA B200", "bfloat16", "bf16", 2250.0),
    ("AMD Instinct MI250X", "float32", "fp32", 95.7),
    ("AMD Instinct MI300X", "bfloat16", "bf16", 1307.4),
])
def test_peak_table(name: str, dtype: str, column: str, tflops: float) -> None:
    device = device_peak(name)
    assert device is not None and peak_dtype(device, dtype) == column
    assert device.tflops[column] == tflops


def test_float32_peak_is_fp32_unless_tf32_kernels() -> None:
    """PyTorch's default is no TF32 for float32 matmuls: FP32's peak, TF32's only on TF32 kernels."""
    a100, v100 = device_peak("NVIDIA A100-SXM4-80GB"), device_peak("Tesla V100-SXM2-16GB")
    assert a100 is not None and v100 is not None
    assert (peak_dtype(a100, "float32"), peak_dtype(a100, "float32", tf32=True)) == ("fp32", "tf32")
    assert peak_dtype(v100, "float32", tf32=True) == "fp32"  # no TF32 on Volta
    assert peak_dtype(a100, "bfloat16", tf32=True) == "bf16"
    for name in ("sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x16_stage4_warpsize2x2x1_tensor16x8x8",
                 "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>(Params)"):
        assert re.search(TF32_KERNEL, name, re.IGNORECASE), name
    for name in ("ampere_sgemm_128x64_nn", "volta_sgemm_32x32_sliced1x4_tn", "nvjet_tst_64x64_64x16_2x1_v_bz_TNT",
                 "void cutlass::Kernel<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(Params)"):
        assert not re.search(TF32_KERNEL, name, re.IGNORECASE), name


def test_peak_table_unknowns() -> None:
    assert device_peak("AMD Radeon Graphics") is None and device_peak("NVIDIA GB200") is None
    assert device_peak(None) is None
    v100 = device_peak("Tesla V100-SXM2-32GB")
    assert v100 is not None and peak_dtype(v100, "bfloat16") is None  # no bfloat16 tensor cores


# ---- the finding ----

def test_low_mfu_finding_on_a100_trace(ingested: Callable[[str], Path]) -> None:
    """trace_diff/control: compute kernels take ~60% of every step, the products would need
    2.9 ms of it at peak (TF32 for most, FP32 for the products cuBLAS ran on SGEMM): MFU 3.8%; their kernels are 13.8 of the 46.9 ms of compute (embedding
    and elementwise kernels are the rest), so the advice is about the rest, not TF32 (the
    products already run above FP32's 19.5 TFLOP/s)."""
    store = open_store(ingested("hta/trace_diff/control/control.json.gz"))
    doc = build_summary(store, "t")
    found = [f for f in doc["findings"] if f["rule"] == "mfu.low"]
    assert len(found) == 1
    finding = found[0]
    steps = {r["step"]: r for r in doc["ranks"][0]["steps"]}
    rows = doc["mfu"]
    stake = sum(steps[r["step"]]["compute_ns"] - r["ideal_ns"] for r in rows) / len(rows)
    assert finding["time_at_stake_ns"] == round(stake)
    assert finding["ranks"] == [3] and finding["evidence"]["ranks"] == [3] and finding["evidence"]["steps"] == 6
    mfu = sorted(r["mfu"] for r in rows)
    assert 0.03 < (mfu[2] + mfu[3]) / 2 < 0.05  # the median of 6 steps (each checked by hand above)
    assert f"MFU {(mfu[2] + mfu[3]) / 2:.1%} on rank 3" in finding["message"]
    assert "outside the matrix products" in finding["message"]
    assert "TF32" not in finding["message"]


def test_no_low_mfu_finding_when_not_compute_bound(ingested: Callable[[str], Path], tmp_path: Path) -> None:
    """resnet_act_checkpoint: MFU 0.2-0.6% but compute is a third of the step (communication
    dominates): not a compute-bound step, no finding. CPU runs have no MFU, so no finding."""
    doc = build_summary(open_store(ingested("tracelens/mi300/resnet_act_checkpoint.json.gz")), "t")
    assert all(r["mfu"] < 0.01 for r in doc["mfu"])
    assert not [f for f in doc["findings"] if f["rule"] == "mfu.low"]
    cpu = build_summary(_store([SAMPLES / "cpu-transformer"], tmp_path / "s"), "r")
    assert not [f for f in cpu["findings"] if f["rule"] == "mfu.low"]


def resnet50_conv_macs(size: int = 224) -> int:
    """Multiply-adds of ResNet-50's convolutions for one image, from the architecture (torchvision's:
    stride in the 3x3 convolution of a bottleneck), by hand."""
    side = size // 2
    macs, side, channels = 64 * 3 * 7 * 7 * side * side, side // 2, 64  # the stem, then max pooling
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for block in range(blocks):
            out = side // (stride if block == 0 else 1)
            macs += width * channels * side * side + width * width * 9 * out * out + 4 * width * width * out * out
            if block == 0:
                macs += 4 * width * channels * out * out  # the downsampling projection
            channels, side = 4 * width, out
    return macs


@pytest.mark.shared
def test_2021_resnet50_convolutions_sized_from_the_next_op(ingested, shared_traces: Path) -> None:
    """resnet50 (2021): shapes as 'Input dims' (lower case), no stride or padding, no output dims.
    Each forward convolution's output is the input of the next op on its thread with the batch and
    output channels (the batch norm): per step exactly ResNet-50's convolutions by hand (4.09 GMACs
    an image, batch 32). The old backward (aten::cudnn_convolution_backward, no output mask)
    counts the gradients its cuDNN _input/_weight ops compute: twice the forward, less the input
    gradient of the stem, which nothing needs. The kernels of the counted ops, from the raw JSON (a
    Runtime call on the op's thread while it ran, its correlation's kernels), are the family's time;
    nothing is skipped."""
    from stepscope.analysis.flops import coverage, skipped_kernels

    relative = "kineto_tb_plugin/old_2021-02/resnet50_profiler_api_num_workers_0.worker0.pt.trace.json.gz"
    raw = load_raw(shared_traces / relative)["traceEvents"]
    ops = sorted((e for e in raw if e.get("cat") == "Operator" and e.get("ph") == "X"), key=lambda e: e["ts"])
    forward, steps = [], {e["name"] for e in raw if str(e.get("name", "")).startswith("ProfilerStep#")}
    for i, op in enumerate(ops):
        if op["name"] != "aten::convolution":
            continue
        x, w = op["args"]["Input dims"][:2]
        after = next(e for e in ops[i + 1:] if e["tid"] == op["tid"] and e["ts"] >= op["ts"] + op["dur"]
                     and (e["args"]["Input dims"] or [[]])[0][:2] == [x[0], w[0]])
        out = after["args"]["Input dims"][0]
        assert after["name"] == "aten::batch_norm" and len(out) == 4
        forward.append(2 * x[0] * math.prod(w) * out[2] * out[3])
    assert len(steps) == 6 and sum(forward) == 6 * 32 * 2 * resnet50_conv_macs()
    stem = 2 * 32 * 64 * 3 * 7 * 7 * 112 * 112

    store = open_store(ingested(relative))
    counted = [r for r in flop_ops(store, "t").to_pylist() if r["counted"]]
    assert sorted(r["flops"] for r in counted if r["name"] == "aten::convolution") == sorted(forward)
    backward = sum(r["flops"] for r in counted if r["name"] == "aten::cudnn_convolution_backward")
    assert backward == 2 * sum(forward) - 6 * stem
    assert {r["name"] for r in counted} == {"aten::convolution", "aten::cudnn_convolution_backward", "aten::addmm",
                                            "aten::mm"}
    assert sum(r["flops"] for r in counted if r["family"] == "matmul") == 6 * 3 * 2 * 32 * 2048 * 1000  # fc, 2 grads

    kernels = {e["args"]["correlation"]: e["dur"] for e in raw if e.get("cat") == "Kernel"}
    runtime = [e for e in raw if e.get("cat") == "Runtime"]
    names = ("aten::convolution", "aten::cudnn_convolution_backward")
    spans = [(e["tid"], e["ts"], e["ts"] + e["dur"]) for e in raw if e.get("name") in names and e.get("ph") == "X"]
    hit = {r["args"]["correlation"] for r in runtime for tid, a, b in spans if r["tid"] == tid and a <= r["ts"] <= b}
    conv_ns = sum(kernels[c] for c in hit if c in kernels) * 1000
    assert conv_ns > 400_000_000  # 421 ms of cuDNN kernels over 6 steps
    rows = {r["family"]: r for r in flops_by_family(store, "t").to_pylist()}
    assert rows["conv"]["ops"] == 636 and rows["conv"]["uncounted_kernel_ns"] == 0
    assert sum(r["gpu_ns"] for r in counted if r["family"] == "conv") == conv_ns
    assert skipped_kernels(store, "t") == {}
    assert coverage(flop_ops(store, "t"), {})[0].share == 1.0


def test_sized_coverage_needed_for_mfu() -> None:
    from stepscope.analysis.flops import Coverage

    reason = Coverage(0, 136_000_000, 318).absence()
    assert reason and "318 product ops" in reason and "MFU needs 90%" in reason
    assert Coverage(95, 5, 1).absence() is None and Coverage(89, 11, 1).absence() is not None


_RANGE_JOIN_SKIPPED = """
WITH skipped AS (
    SELECT rank, source, pid, tid, family, ts_ns, ts_ns + dur_ns AS end_ns FROM rank_flop_ops
    WHERE run = $run AND leaf AND flops IS NULL AND NOT counted AND NOT starts_with(coalesce(reason, ''), 'inside ')
), launches AS (
    SELECT DISTINCT s.rank, s.family, l.source, l.correlation
    FROM events l JOIN skipped s ON l.source = s.source AND l.pid IS NOT DISTINCT FROM s.pid
     AND l.tid IS NOT DISTINCT FROM s.tid AND l.ts_ns >= s.ts_ns AND l.ts_ns <= s.end_ns
    WHERE l.run = $run AND l.kind IN ('cuda_runtime', 'cuda_driver') AND l.correlation IS NOT NULL
)
SELECT l.rank, l.family, sum(k.dur_ns)::BIGINT AS kernel_ns,
       (SELECT count(*) FROM skipped s WHERE s.rank = l.rank AND s.family = l.family) AS ops
FROM launches l JOIN events k ON k.source = l.source AND k.correlation = l.correlation
WHERE k.run = $run AND k.kind = 'kernel' AND k.category = 'compute' AND k.dur_ns IS NOT NULL
GROUP BY l.rank, l.family
"""
"""The definition, as a plain range join: every call on a skipped op's thread while it ran (closed
interval), each once per family, and its compute kernels."""


@pytest.mark.shared
def test_skipped_kernels_from_ingest_and_from_events_match_the_range_join(ingested, tmp_path: Path) -> None:
    """df_index_resolver's 2,665 skipped ops: what ingest stored (``rank_flop_skipped``) and what
    a store ingested before that table existed gets from its events (the table removed) both
    equal the plain range join over the events."""
    from stepscope.analysis.flops import skipped_kernels

    store_dir = tmp_path / "store"
    shutil.copytree(ingested("hta/df_index_resolver/df_index_resolver.json.gz"), store_dir)
    store = open_store(store_dir)
    expected = {(r["rank"], r["family"]): (r["ops"], r["kernel_ns"])
                for r in store.sql(_RANGE_JOIN_SKIPPED, {"run": "t"}).to_pylist()}
    assert len(expected) == 1 and next(iter(expected.values()))[0] == 2665 and next(iter(expected.values()))[1] > 0
    assert store.sql("SELECT count(*) AS n FROM rank_flop_skipped").to_pylist() == [{"n": 1}]
    assert skipped_kernels(store, "t") == expected
    shutil.rmtree(store_dir / "rank_flop_skipped")
    for compacted in store_dir.glob(".compact/run=*/rank_flop_skipped-*.parquet"):
        compacted.unlink()
    older = open_store(store_dir)
    assert older.sql("SELECT count(*) AS n FROM rank_flop_skipped").to_pylist() == [{"n": 0}]
    assert skipped_kernels(older, "t") == expected


@pytest.mark.parametrize("spans", [
    [(0, 10), (11, 20)],
    [(0, 10), (10, 20)],  # closed intervals: a call at 10 lies in both, counted once
    [(0, 30), (5, 10)],  # nested: the call at 20 lies only in the outer op, started earlier
    [(0, 30), (40, 50), (45, 46)],
    [(0, None), (5, 10)],  # an op without an end holds no call
    [(5, None), (0, 3)],
])
def test_skipped_kernels_query_counts_each_kernel_once_however_the_ops_overlap(
        spans: list[tuple[int, int | None]]) -> None:
    """The as-of join over islands of skipped ops finds what a plain count finds: each kernel
    whose launch call lies in (closed) any skipped op of its thread, once per family."""
    import duckdb

    from stepscope.store.rankstats.flops import skipped_kernels_query

    con = duckdb.connect()
    ops = [("mm", a, None if b is None else b - a) for a, b in spans] + [("conv", 0, 100)]
    con.execute("CREATE TABLE ops (source VARCHAR, pid BIGINT, tid BIGINT, family VARCHAR, ts_ns BIGINT, "
                "dur_ns BIGINT, leaf BOOLEAN, flops BIGINT, counted BOOLEAN, reason VARCHAR)")
    con.executemany("INSERT INTO ops VALUES ('s', 1, 1, ?, ?, ?, TRUE, NULL, FALSE, NULL)",
                    [(family, a, d) for family, a, d in ops])
    calls = [(c, t) for c, t in enumerate((0, 3, 5, 10, 11, 20, 30, 45, 50, 60), start=1)]
    con.execute("CREATE TABLE events (run VARCHAR, source VARCHAR, pid BIGINT, tid BIGINT, kind VARCHAR, "
                "category VARCHAR, correlation BIGINT, ts_ns BIGINT, dur_ns BIGINT)")
    con.executemany("INSERT INTO events VALUES ('r', 's', 1, ?, 'cuda_runtime', NULL, ?, ?, 1)",
                    [(1, c, t) for c, t in calls] + [(2, 100 + c, t) for c, t in calls])  # thread 2: no skipped op
    con.executemany("INSERT INTO events VALUES ('r', 's', NULL, NULL, 'kernel', 'compute', ?, 1000, ?)",
                    [(c, 7 * c) for c, _ in calls] + [(100 + c, 1) for c, _ in calls])
    query = f"SELECT family, ops, kernel_ns FROM ({skipped_kernels_query('ops', ('source',), 'TRUE')})"
    got = {r[0]: (r[1], r[2]) for r in con.execute(query, {"run": "r"}).fetchall()}
    expected = {}
    for family in ("conv", "mm"):
        spans_of = [(a, None if d is None else a + d) for f, a, d in ops if f == family]
        hit = {c for c, t in calls for a, b in spans_of if b is not None and a <= t <= b}
        expected[family] = (len(spans_of), sum(7 * c for c in hit) if hit else None)
    assert got == expected
