"""``rank_flop_ops`` and ``rank_flop_traces``, computed at ingest in SQL, against plain Python.

The reference (``tests/_flop_reference.py``) is the counting as the analysis did it from the
events before the tables existed, formulas and reasons written out again in Python: every
shared trace with an op of a FLOP family gives the same rows (FLOPs, counted, reason, dtype,
kernels), the same ranks with shapes and the same GPU ranks. Built traces cover what no shared
trace has (nested wrappers, malformed shapes, a rank of two traces), and a store of schema
version 2 is refused until ``stepscope migrate`` writes these tables.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

import pytest

from stepscope.analysis.flops import OPS_SCHEMA, _shapes_recorded, flop_ops, flops_by_family, mfu_steps, rank_devices
from stepscope.cli import main
from stepscope.errors import StoreError
from stepscope.store import open_store
from stepscope.store.ingest import ingest_paths
from tests._store_versions import as_older_version
from tests._flop_reference import reference_ops

FLOP_TRACES = [
    "hta/trace_diff/control/control.json.gz",
    "hta/trace_diff/test/test.json.gz",
    "hta/df_index_resolver/df_index_resolver.json.gz",
    "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "hta/trace_filter/sampled_rank-0.json.gz",
    "hta/nccl_parser_config/nccl_data.json.gz",
    "hta/mtia_trace_single_rank/mtia_rank_0.json.gz",
    "hta/rank_non_gpu/rank_non_gpu.json.gz",
    "hta/with_gpu_user_annotation/step_based_trace_2543932.json.gz",
    "hta/negative_queue_length_values_check/rank0.json.gz",
    "hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "param/linear_kineto.json.gz",
    "param/resnet_kineto.json.gz",
    "kineto_tb_plugin/old_2021-02/resnet50_profiler_api_num_workers_0.worker0.pt.trace.json.gz",
    "tracelens/inference/xdit_sd_3.5/profile_trace_rank_0.json.gz",
    "tracelens/inference/xdit_flux.1/capture_traces/capture_trace_rank_0.json.gz",
    "tracelens/inference/xdit_flux.1_aiter_sage/profile_trace_rank_0.json.gz",
    "tracelens/inference/sglang_decode/capture_traces/bs_32_rank0.json.gz",
    "tracelens/inference/sglang_prefilldecode/sglang_Qwen3-8B_prefilldecode.json.gz",
    "tracelens/inference/vllm_decode_full/capture_traces/graph_capture_rank_0.1773709742341309550.pt.trace.json.gz",
    "tracelens/mi300/ddp_resnet18_no_pool_train_resnet18.json.gz",
    "tracelens/mi300/resnet_act_checkpoint.json.gz",
    "tracelens/b200/eager_trace.json.gz",
    "tracelens/torch_compile_triton/trace.json.gz",
]
"""Shared traces with CPU ops of a FLOP family (with shapes or without: both are rows)."""


def _rows(ops: Any) -> list[tuple[Any, ...]]:
    """The rows as sortable tuples of :data:`OPS_SCHEMA`'s columns (ties of one thread, instant
    and name may come in any order)."""
    rows = ops if isinstance(ops, list) else ops.to_pylist()
    return sorted((tuple(repr(r[c]) for c in OPS_SCHEMA.names) for r in rows))


def _old_ranks(store: Any) -> tuple[set[int], dict[int, bool]]:
    """The ranks with shapes and the GPU ranks as the analysis found them in the events before."""
    shaped = store.sql("""SELECT DISTINCT rank FROM events WHERE run = 't' AND kind = 'cpu_op'
                          AND (args LIKE '%"Input Dims"%' OR args LIKE '%"Input dims"%')""").to_pylist()
    gpu = store.sql("""SELECT s.rank, EXISTS (SELECT 1 FROM events e WHERE e.run = 't' AND e.rank = s.rank
                       AND e.kind = 'kernel') AS gpu FROM sources s WHERE s.run = 't' GROUP BY s.rank""").to_pylist()
    return {r["rank"] for r in shaped}, {r["rank"]: r["gpu"] for r in gpu}


@pytest.mark.shared
@pytest.mark.parametrize("relative", FLOP_TRACES, ids=[t.split("/")[-1].split(".")[0][:40] for t in FLOP_TRACES])
def test_stored_flop_ops_equal_the_counting_in_python(ingested: Callable[[str], Path], relative: str) -> None:
    store = open_store(ingested(relative))
    ops = flop_ops(store, "t")
    assert ops.num_rows > 0
    assert _rows(ops) == _rows(reference_ops(store, "t"))
    shaped, gpu = _old_ranks(store)
    assert _shapes_recorded(store, "t", None) == shaped
    assert {rank: device.gpu for rank, device in rank_devices(store, "t").items()} == gpu


def _op(name: str, ts: float, dur: float, dims: list, concrete: list | None = None, tid: int = 1,
        **args: Any) -> dict[str, Any]:
    a: dict[str, Any] = {"Input Dims": dims, "Input type": ["float"] * len(dims), **args}
    if concrete is not None:
        a["Concrete Inputs"] = concrete
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": a}


def _conv_args(stride: str, padding: str, dilation: str = "[1, 1]", transposed: str = "False") -> list[str]:
    return ["", "", "", stride, padding, dilation, transposed, "[0, 0]", "1"]


EDGE_EVENTS = [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 2000},
    # a wrapper inside a wrapper, a leaf after the inner one ended: the outer one counts nothing
    _op("aten::linear", 10, 100, [[4, 16, 32], [8, 32], [8]]),
    _op("aten::matmul", 11, 20, [[4, 16, 32], [32, 8]]),
    _op("aten::mm", 50, 5, [[64, 32], [32, 8]]),
    # a wrapper inside a counting wrapper; then a leaf inside the inner one
    _op("aten::matmul", 200, 100, [[2, 3, 4], [4, 5]]),
    _op("aten::linear", 210, 50, [[2, 3, 4], [5, 4], [5]]),
    _op("aten::matmul", 320, 100, [[2, 3, 4], [4, 5]]),
    _op("aten::linear", 330, 50, [[2, 3, 4], [5, 4], [5]]),
    _op("aten::bmm", 340, 5, [[2, 3, 4], [2, 4, 5]]),
    # leaves inside leaves, equal spans, a zero-length op at an op's end
    _op("aten::_scaled_dot_product_flash_attention", 500, 50, [[1, 2, 8, 4]] * 3, ["", "", "", "", "True"]),
    _op("aten::_flash_attention_forward", 500, 50, [[1, 8, 2, 4]] * 3, [""] * 8 + ["True"]),
    _op("aten::mm", 550, 0, [[2, 2], [2, 2]]),
    # what the formulas refuse, and their broadcasting
    _op("aten::matmul", 600, 5, [[3, 4], [4]]),
    _op("aten::matmul", 610, 5, [[4], [2, 4, 3]]),
    _op("aten::matmul", 620, 5, [[2, 3, 4], [3, 4, 5]]),
    _op("aten::mm", 630, 5, [[2, 3], [4, 5]]),
    _op("aten::mm", 640, 5, [[2, 3]]),
    _op("aten::mm", 650, 5, [[2, 3], 7]),
    _op("aten::bmm", 660, 5, [[2, 3], [3]]),
    _op("aten::linear", 670, 5, [[2, 3], [4, 3, 1]]),
    _op("aten::_scaled_dot_product_efficient_attention", 680, 5, [[1, 2, 8, 4], [1, 2, 8], [1, 2, 8, 4]]),
    _op("aten::_efficient_attention_forward", 690, 5, [[1, 6, 2, 4], [1, 9, 2, 4], [1, 9, 2, 4]], [""] * 9 + ["2"]),
    _op("aten::_efficient_attention_backward", 700, 5, [[], [1, 6, 2, 4], [1, 9, 2, 4], [1, 9, 2, 4]],
        [""] * 14 + ["1"]),
    _op("aten::convolution", 710, 5, [[1, 3, 8, 8], [4, 3, 3, 3]], _conv_args("[2]", "[1, 1]")),
    _op("aten::convolution", 720, 5, [[1, 3, 8, 8], [4, 3, 3, 3]], _conv_args("[2, 2, 2]", "[1, 1]")),
    _op("aten::convolution", 730, 5, [[1, 3, 8, 8], [4, 3, 3, 3]], _conv_args("[a, 1]", "[1, 1]")),
    _op("aten::convolution", 740, 5, [[1, 3, 2, 2], [4, 3, 5, 5]], _conv_args("[2, 2]", "[0, 0]")),
    _op("aten::convolution", 750, 5, [[1, 3, 8, 8], [4, 3, 3, 3]], _conv_args("[1, 1]", "[0, 0]", transposed="True")),
    _op("aten::convolution", 760, 5, [[1, 3, 8], [4, 3, 3, 3]], _conv_args("[1, 1]", "[0, 0]")),
    _op("aten::conv2d", 770, 5, [[1, 3, 8, 8], [4, 3, 3, 3]], ["", "", "", "[1]", "'same'", "[1]", "1"]),
    _op("aten::conv2d", 780, 5, [[1, 3, 8, 8], [4, 3, 3, 3]], ["", "", "", "[2]", "valid", "[1]", "1"]),
    _op("aten::conv_transpose2d", 790, 5, [[1, 3, 8, 8], [3, 4, 3, 3]]),
    _op("aten::convolution_backward", 800, 5, [[1, 4, 6, 6], [1, 3, 8, 8], [4, 3, 3, 3]],
        [""] * 10 + ["[False, True, True]"]),
    _op("aten::convolution_backward", 810, 5, [[1, 4, 6, 6], [1, 3, 8, 8], [4, 3, 3]]),
    _op("aten::addmm", 820, 5, [[8], [4, 3], [3, 8]], flops=99),
    _op("aten::addmm", 830, 5, [[8], [4, 3]], flops=True),
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 840, "dur": 5},
]


def _built(make_trace: Callable[..., Path], tmp_path: Path, events: list[dict[str, Any]]) -> tuple[Any, Any, dict]:
    """The store of a built trace, its ``flop_ops`` (checked equal to the reference) and its rows
    by (name, start in us)."""
    report = ingest_paths([make_trace("rank0.json", events)], tmp_path / "s", "r")
    assert report.ok, report.errors
    store = open_store(tmp_path / "s")
    ops = flop_ops(store, "r")
    assert _rows(ops) == _rows(reference_ops(store, "r"))
    return store, ops, {(r["name"], r["ts_ns"] // 1000): r for r in ops.to_pylist()}


def test_built_edges_equal_the_counting_in_python(make_trace: Callable[..., Path], tmp_path: Path) -> None:
    """Nested wrappers (a wrapper that counted until a leaf ran inside an inner wrapper), leaves
    of equal spans, zero-length ops, and each reason a formula gives, against the reference."""
    _, ops, by = _built(make_trace, tmp_path, EDGE_EVENTS)
    assert [by[("aten::linear", 10)]["counted"], by[("aten::matmul", 11)]["counted"], by[("aten::mm", 50)]["counted"]] \
        == [False, False, True]
    assert by[("aten::linear", 210)]["reason"] == "inside aten::matmul, which counts these products"
    assert by[("aten::matmul", 200)]["counted"]
    assert by[("aten::linear", 330)]["reason"] == by[("aten::matmul", 320)]["reason"] \
        == "a wrapper: aten::bmm inside it counts"
    assert by[("aten::matmul", 620)]["reason"] == "batch dimensions of [2, 3, 4] and [3, 4, 5] do not broadcast"
    assert by[("aten::convolution", 720)]["reason"] == "stride '[2, 2, 2]' does not have 2 entries"
    assert by[("aten::mm", 840)]["reason"] == "argument 0 not recorded"
    reasons = [r["reason"] for r in ops.to_pylist() if r["flops"] is None]
    assert len(set(reasons)) >= 10  # the refusals above are all different


def _old(name: str, ts: float, dur: float, dims: list, tid: str = "7") -> dict[str, Any]:
    """A CPU op as 2021's Kineto wrote it: ``Input dims``, no ``Concrete Inputs``, a string tid."""
    return {"ph": "X", "cat": "Operator", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {"Input dims": dims, "Input type": [], "Output dims": []}}


OLD_CONV_EVENTS = [
    {"ph": "X", "cat": "Operator", "name": "ProfilerStep#1", "pid": 1, "tid": "7", "ts": 0, "dur": 2000},
    # conv2d -> convolution, then a scalar add, then the batch norm: stride 2, padding 3 by the next op
    _old("aten::conv2d", 10, 50, [[2, 3, 16, 16], [8, 3, 7, 7], [], [], [], [], []]),
    _old("aten::convolution", 11, 40, [[2, 3, 16, 16], [8, 3, 7, 7], [], [], [], [], [], [], []]),
    _old("aten::add", 70, 2, [[], [], []]),
    _old("aten::batch_norm", 80, 20, [[2, 8, 8, 8], [8], [8], [8], [8], [], [], [], []]),
    # on another thread: an op of the right batch and channels that is not the next op of this one
    _old("aten::relu", 120, 5, [[2, 4, 3, 3]], tid="8"),
    # the next op's input is larger than the input: not taken
    _old("aten::convolution", 110, 5, [[2, 3, 4, 4], [4, 3, 1, 1], [], [], [], [], [], [], []]),
    _old("aten::relu", 130, 5, [[2, 4, 6, 6]]),
    # nothing after it of its batch and channels
    _old("aten::convolution", 200, 5, [[2, 3, 4, 4], [5, 3, 1, 1], [], [], [], [], [], [], []]),
    # old backward convolutions: both gradient ops inside, only the weight's, none (both counted)
    _old("aten::cudnn_convolution_backward", 300, 20, [[2, 3, 16, 16], [2, 8, 8, 8], [8, 3, 7, 7]] + [[]] * 8),
    _old("aten::cudnn_convolution_backward_input", 301, 5, [[], [2, 8, 8, 8], [8, 3, 7, 7]]),
    _old("aten::cudnn_convolution_backward_weight", 310, 5, [[], [2, 8, 8, 8], [2, 3, 16, 16]]),
    _old("aten::cudnn_convolution_backward", 400, 20, [[2, 3, 16, 16], [2, 8, 8, 8], [8, 3, 7, 7]] + [[]] * 8),
    _old("aten::cudnn_convolution_backward_weight", 410, 5, [[], [2, 8, 8, 8], [2, 3, 16, 16]]),
    _old("aten::cudnn_convolution_backward", 500, 20, [[2, 3, 16, 16], [2, 8, 8, 8], [8, 3, 7, 7]] + [[]] * 8),
    _old("aten::cudnn_convolution_backward_weight", 530, 5, [[], [2, 8, 8, 8], [2, 3, 16, 16]]),  # after it
]


def test_old_convolutions_sized_from_the_next_op(make_trace: Callable[..., Path], tmp_path: Path) -> None:
    """2021 Kineto: ``Input dims``, no stride or padding, string thread ids. A convolution's output
    is the next op's input on its thread with its batch and output channels, when no larger than its
    input; an old backward convolution counts the gradient ops recorded inside it. By hand, and
    against the reference."""
    store, _, by = _built(make_trace, tmp_path, OLD_CONV_EVENTS)
    forward = 2 * 2 * 8 * 3 * 7 * 7 * 8 * 8  # N=2, C_out=8, C_in=3, 7x7 kernel, 8x8 output
    assert by[("aten::convolution", 11)]["flops"] == forward and by[("aten::convolution", 11)]["counted"]
    assert by[("aten::conv2d", 10)]["flops"] == forward and not by[("aten::conv2d", 10)]["counted"]
    assert by[("aten::convolution", 110)]["reason"] == ("the next op's input [2, 4, 6, 6] is larger than the input "
                                                        "[2, 3, 4, 4]: not taken as the output, and no stride or "
                                                        "padding recorded")
    assert by[("aten::convolution", 200)]["reason"] == "transposed not recorded (Concrete Inputs)"
    assert [by[("aten::cudnn_convolution_backward", t)]["flops"] for t in (300, 400, 500)] \
        == [2 * forward, forward, 2 * forward]
    assert _shapes_recorded(store, "r", None) == {0}


def test_a_rank_of_two_traces(make_trace: Callable[..., Path], tmp_path: Path) -> None:
    """Two profiled windows of one rank: the one without kernel launches still gets 0 kernel ns for
    its counted ops (the rank launched kernels), and the families add both."""
    def window(step: int, base: int, launch: bool) -> list[dict[str, Any]]:
        events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                   "ts": base, "dur": 100},
                  _op("aten::mm", base + 10, 20, [[64, 32], [32, 8]])]
        if launch:
            events += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                        "ts": base + 12, "dur": 2, "args": {"correlation": 5}},
                       {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_32x32", "pid": 0, "tid": 7, "ts": base + 40,
                        "dur": 7, "args": {"correlation": 5, "stream": 7, "device": 0}}]
        return events

    paths = [make_trace("a/rank0.json", window(1, 1000, True), distributedInfo={"rank": 0}),
             make_trace("b/rank0.json", window(2, 1500, False), distributedInfo={"rank": 0})]
    report = ingest_paths(paths, tmp_path / "s", "r")
    assert report.ok, report.errors
    store = open_store(tmp_path / "s")
    assert store.sql("SELECT count(*) AS n FROM sources WHERE run = 'r'").to_pylist() == [{"n": 2}]
    ops = flop_ops(store, "r").to_pylist()
    assert sorted(r["gpu_ns"] for r in ops) == [0, 7000]
    assert _rows(ops) == _rows(reference_ops(store, "r"))
    [family] = flops_by_family(store, "r").to_pylist()
    assert (family["flops"], family["time_ns"], family["kernels"]) == (2 * 2 * 64 * 32 * 8, 7000, 1)
    assert [r["kernel_ns"] for r in mfu_steps(store, "r").to_pylist()] == [7000, 0]


@pytest.mark.shared
def test_a_version_2_store_gets_its_flop_tables_from_migrate(ingested: Callable[[str], Path], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "store"
    shutil.copytree(ingested("hta/trace_diff/control/control.json.gz"), store)
    before = (flop_ops.__wrapped__(open_store(store), "t"), mfu_steps(open_store(store), "t"))
    as_older_version(store, 2, ("rank_flop_ops", "rank_flop_traces"))
    with pytest.raises(StoreError, match=r"schema version 2, older .*stepscope migrate --store"):
        open_store(store)
    assert main(["migrate", "--store", str(store)]) == 0
    assert "1 traces migrated" in capsys.readouterr().out
    migrated = open_store(store)
    assert flop_ops.__wrapped__(migrated, "t").equals(before[0]) and before[0].num_rows
    assert mfu_steps(migrated, "t").equals(before[1])
