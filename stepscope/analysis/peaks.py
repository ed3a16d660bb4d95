"""Dense peak FLOP rates of accelerators, by device and dtype: the denominator of MFU.

One table (:data:`DEVICE_PEAKS`), from the vendors' datasheets, **dense** figures (NVIDIA's
"with sparsity" numbers are twice these; they are never used). A device is recognised by
the name its trace records (``deviceProperties[].name``, stored as ``sources.gpu_name``), first
matching row wins, so the more specific variants (H100 PCIe, H100 NVL) come before the generic
name. A device not in the table has no peak, and MFU is absent with the reason, never guessed.

The dtype of an op is its first tensor input's ``Input type`` as the trace records it
(``c10::BFloat16``, ``float``), named as torch names it at ingest
(:data:`stepscope.store.rankstats.flops.TRACE_DTYPES`); :func:`peak_dtype` maps it to the column
of the table.
``float32`` products are judged against the **FP32** peak: PyTorch's default for float32
matmuls on CUDA is full FP32 (``torch.backends.cuda.matmul.allow_tf32`` is False since 1.12).
Only when the kernels the op launched are TF32 kernels (:data:`TF32_KERNEL`, applied at ingest:
a name with ``tf32``/``xf32``, such as cuDNN's ``sm80_xmma_..._tf32f32_...``, or CUTLASS's
``tensorop_s1688gemm``, the TF32 tensor-core SGEMM of cuBLAS on Ampere and later) is the op
judged against the device's TF32 peak (falling back to FP32 where the device has none). An
SGEMM such as ``ampere_sgemm_*`` or a kernel name that says nothing (``nvjet_*``, ``Cijk_*``) is FP32.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from stepscope.store.rankstats.flops import TF32_KERNEL

__all__ = ["DEVICE_PEAKS", "PEAK_DTYPES", "TF32_KERNEL", "DevicePeak", "device_peak", "peak_dtype"]

PEAK_DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")
"""Columns of the peak table, TFLOP/s (TOP/s for int8)."""

_PEAK_COLUMN: Mapping[str, str] = {
    "float64": "fp64",
    "float32": "fp32",
    "float16": "fp16",
    "bfloat16": "bf16",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "float8_e4m3fnuz": "fp8",
    "float8_e5m2fnuz": "fp8",
    "int8": "int8",
}
"""torch dtype -> peak-table column (float32: fp32, or tf32 on TF32 kernels; see :func:`peak_dtype`)."""


@dataclass(frozen=True)
class DevicePeak:
    """One device: how its name reads in traces, and its dense peak per dtype (TFLOP/s).

    A dtype missing from ``tflops`` has no peak on this device (V100 has no bfloat16 or FP8
    tensor cores): MFU for it is absent.
    """

    device: str
    pattern: str
    tflops: Mapping[str, float] = field(default_factory=dict)
    source: str = ""

    def matches(self, gpu_name: str) -> bool:
        return re.search(self.pattern, gpu_name, re.IGNORECASE) is not None


def _peaks(fp64: float, fp32: float, tf32: float | None, bf16: float | None, fp16: float,
           fp8: float | None, int8: float | None) -> dict[str, float]:
    values = {"fp64": fp64, "fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": fp16, "fp8": fp8, "int8": int8}
    return {k: v for k, v in values.items() if v is not None}


DEVICE_PEAKS: tuple[DevicePeak, ...] = (
    DevicePeak("V100 PCIe", r"V100-PCIE|V100 PCIe", _peaks(7.0, 14.0, None, None, 112.0, None, None),
               "NVIDIA Tesla V100 datasheet (PCIe)"),
    DevicePeak("V100S PCIe", r"V100S", _peaks(8.2, 16.4, None, None, 130.0, None, None),
               "NVIDIA Tesla V100S datasheet"),
    DevicePeak("V100 SXM2", r"V100", _peaks(7.8, 15.7, None, None, 125.0, None, None),
               "NVIDIA Tesla V100 datasheet (SXM2)"),
    DevicePeak("A100", r"A100", _peaks(19.5, 19.5, 156.0, 312.0, 312.0, None, 624.0),
               "NVIDIA A100 datasheet (SXM4 and PCIe; FP64 tensor core)"),
    DevicePeak("H100 PCIe", r"H100 PCIe", _peaks(51.0, 51.0, 378.0, 756.0, 756.0, 1513.0, 1513.0),
               "NVIDIA H100 datasheet (PCIe), dense = half the sparsity figures"),
    DevicePeak("H100/H200 NVL", r"H[12]00 NVL", _peaks(60.0, 60.0, 417.5, 835.5, 835.5, 1670.5, 1670.5),
               "NVIDIA H100 NVL / H200 NVL datasheets, dense = half the sparsity figures"),
    DevicePeak("H100/H200 SXM", r"H100|H200|GH200", _peaks(67.0, 67.0, 494.7, 989.4, 989.4, 1978.9, 1978.9),
               "NVIDIA H100 SXM / H200 SXM datasheets, dense = half the sparsity figures"),
    DevicePeak("B200", r"(?<!G)B200", _peaks(37.0, 75.0, 1125.0, 2250.0, 2250.0, 4500.0, 4500.0),
               "NVIDIA HGX B200 datasheet per GPU, dense = half the sparsity figures"),
    DevicePeak("MI250X", r"MI250X", _peaks(95.7, 95.7, None, 383.0, 383.0, None, 383.0),
               "AMD Instinct MI250X datasheet (matrix cores)"),
    DevicePeak("MI250", r"MI250", _peaks(90.5, 90.5, None, 362.1, 362.1, None, 362.1),
               "AMD Instinct MI250 datasheet (matrix cores)"),
    DevicePeak("MI300X", r"MI300X", _peaks(163.4, 163.4, 653.7, 1307.4, 1307.4, 2614.9, 2614.9),
               "AMD Instinct MI300X datasheet (matrix cores), dense"),
)
"""Dense peak TFLOP/s per device and dtype; first match on the trace's device name wins."""


def device_peak(gpu_name: str | None) -> DevicePeak | None:
    """The table row for a device name as the trace records it, or None (unknown device)."""
    if not gpu_name:
        return None
    return next((d for d in DEVICE_PEAKS if d.matches(gpu_name)), None)


def peak_dtype(device: DevicePeak, dtype: str | None, tf32: bool = False) -> str | None:
    """The peak-table column for ``dtype`` on ``device`` (module docs), or None when it has none;
    ``tf32``: the op's kernels are TF32 kernels (float32 only: its TF32 peak where there is one)."""
    column = _PEAK_COLUMN.get(dtype or "")
    if column == "fp32" and tf32 and "tf32" in device.tflops:
        column = "tf32"
    return column if column in device.tflops else None
