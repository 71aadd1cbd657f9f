"""CPU kernels for expert matrices in their GGUF bytes: GEMV/small GEMM and whole SwiGLU experts.

Formats with a kernel: Q8_0, Q4_0, Q4_K, Q6_K and Strata's Q2_0; others fall back to torch dequantize-and-multiply.
The pool runs the SIMD row functions of `simd_ir` (LLVM IR, driven by numba in `simd_pool`); `blocks` holds the
earlier pure-numba kernels (STRATA_CPU_POOL_OLD). Accuracy: activations are int16 codes per group (int8 under
STRATA_CPU_POOL_INT8); see `activations` for the bound against float64.
"""

from strata.engine.cpu_kernels.activations import ACCUMULATION_ERROR, INPUT_ERROR, input_error, quantize_rows
from strata.engine.cpu_kernels.gemv import gemv, gemv_pairs, supported
from strata.engine.cpu_kernels.swiglu import HostExperts, moe_experts

__all__ = ["ACCUMULATION_ERROR", "INPUT_ERROR", "HostExperts", "gemv", "gemv_pairs", "input_error", "moe_experts",
           "quantize_rows", "supported"]
