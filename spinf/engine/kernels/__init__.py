"""Triton kernels of the GPU path (engine spec C.1, C.3): tree attention, the row-wise fused operations, and the fp8
GLU GEMM (`gemm`: gate/up, GELU·up and the down projection's quantizer in one kernel).

Every kernel has one fixed configuration (no autotuning) and computes each output row from that row's inputs
alone, so a row's bits never depend on how many rows share the launch or where the row sits. Each kernel is tested
against the plain torch code it replaces (tests/engine/test_kernels.py), on the GPU and, through Triton's
interpreter (``TRITON_INTERPRET=1``), on the CPU.

Import this package only where Triton is needed: the CPU path never imports it.
"""

from spinf.engine.kernels import gemm
from spinf.engine.kernels.attention import KernelPlan, kernel_plan, tile_rows, to_device, tree_attention_kernel
from spinf.engine.kernels.rows import (
    add_norm,
    gelu_mul,
    norm_rows,
    prepare_qkv,
    qkv_norm_weights,
    quantize_dynamic,
    quantize_rows,
    softcap_logsumexp,
)

__all__ = [
    "KernelPlan",
    "add_norm",
    "gelu_mul",
    "gemm",
    "kernel_plan",
    "norm_rows",
    "prepare_qkv",
    "qkv_norm_weights",
    "quantize_dynamic",
    "quantize_rows",
    "softcap_logsumexp",
    "tile_rows",
    "to_device",
    "tree_attention_kernel",
]
