"""Each classification rule, on real names taken from the shared traces."""

from __future__ import annotations

import pytest

from stepscope.store.classify import classify, dtype_bytes, normalise_collective

CASES = [
    # (cat, name, ph, kind, category) -- names copied from ../shared/traces
    ("kernel", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "X", "kernel", "communication"),
    ("kernel", "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "X", "kernel", "communication"),
    ("kernel", "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "X", "kernel", "communication"),
    ("kernel", "void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 8>(...)", "X", "kernel",
     "communication"),
    ("kernel", "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", "X", "kernel", "communication"),
    ("kernel", "void at::native::elementwise_kernel_manual_unroll<128, 4, at::native::broadcast>", "X", "kernel",
     "compute"),
    ("Kernel", "volta_sgemm_128x64_nn", "X", "kernel", "compute"),
    ("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", "X", "memcpy", "memcpy_h2d"),
    ("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", "X", "memcpy", "memcpy_h2d"),
    ("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", "X", "memcpy", "memcpy_d2h"),
    ("gpu_memcpy", "Memcpy DtoD (Device -> Device)", "X", "memcpy", "memcpy_d2d"),
    ("Memcpy", "Memcpy HtoD (Pageable -> Device)", "X", "memcpy", "memcpy_h2d"),
    ("gpu_memset", "Memset (Device)", "X", "memset", "memset"),
    ("Memset", "Memset (Device)", "X", "memset", "memset"),
    ("cuda_runtime", "cudaStreamSynchronize", "X", "cuda_runtime", "sync"),
    ("cuda_runtime", "hipDeviceSynchronize", "X", "cuda_runtime", "sync"),
    ("cuda_runtime", "cudaStreamWaitEvent", "X", "cuda_runtime", "sync"),
    ("cuda_runtime", "cudaLaunchKernel", "X", "cuda_runtime", "host"),
    ("Runtime", "cudaLaunchKernel", "X", "cuda_runtime", "host"),
    ("cuda_driver", "cuLaunchKernel", "X", "cuda_driver", "host"),
    ("cpu_op", "c10d::allreduce_", "X", "cpu_op", "communication"),
    ("cpu_op", "record_param_comms", "X", "cpu_op", "communication"),
    ("user_annotation", "gloo:all_reduce", "X", "user_annotation", "communication"),
    ("user_annotation", "nccl:all_reduce", "X", "user_annotation", "communication"),
    ("cpu_op", "symm_mem::multimem_all_reduce_", "X", "cpu_op", "communication"),
    ("cpu_op", "aten::mm", "X", "cpu_op", "host"),
    ("Operator", "aten::conv2d", "X", "cpu_op", "host"),
    ("python_function", "torch/nn/modules/module.py(1501): _call_impl", "X", "python_function", "host"),
    ("user_annotation", "ProfilerStep#5", "X", "user_annotation", "host"),
    ("gpu_user_annotation", "ProfilerStep#5", "X", "gpu_annotation", None),
    ("cpu_instant_event", "[memory]", "i", "memory", None),
    (None, "[memory]", "i", "memory", None),
    ("ac2g", "ac2g", "s", "flow", None),
    ("async_cpu_to_gpu", "async_cpu_to_gpu", "f", "flow", None),
    ("fwdbwd", "fwdbwd", "f", "flow", None),
    ("cuda_sync", "Stream Sync", "X", "other", "sync"),
    (None, "process_name", "M", "other", None),
]


@pytest.mark.parametrize(("cat", "name", "ph", "kind", "category"), CASES)
def test_rule(cat, name, ph, kind, category) -> None:
    assert classify(cat, name, ph) == (kind, category)


@pytest.mark.parametrize(
    ("name", "collective"),
    [("allreduce", "all_reduce"), ("_allgather_base", "all_gather"), ("_reduce_scatter_base", "reduce_scatter"),
     ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "all_reduce"),
     ("ncclDevKernel_AllGather_RING_LL(x)", "all_gather"), ("c10d::alltoall_base_", "all_to_all"),
     ("gloo:broadcast", "broadcast"), ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(x)", "send_recv"),
     ("c10d::barrier", "barrier"), ("record_param_comms", None)],
)
def test_collective_names(name: str, collective: str | None) -> None:
    assert normalise_collective(name) == collective


def test_dtype_sizes() -> None:
    assert [dtype_bytes(d) for d in ("Float", "c10::BFloat16", "Half", "Long", "Byte", None, "weird")] == \
        [4, 2, 2, 8, 1, None, None]
