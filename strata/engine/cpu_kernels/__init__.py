"""CPU block kernels for expert matrices in their GGUF bytes (numba): GEMV/small GEMM and whole SwiGLU experts.

Formats with a kernel: Q8_0, Q4_0, Q4_K, Q6_K and Strata's Q2_0; others fall back to torch dequantize-and-multiply.
Accuracy: activations are int16 per weight-block group (see `activations` for the bound against float64).
"""

from strata.engine.cpu_kernels.activations import ACCUMULATION_ERROR, INPUT_ERROR, input_error, quantize_rows
from strata.engine.cpu_kernels.gemv import gemv, gemv_pairs, supported
from strata.engine.cpu_kernels.swiglu import HostExperts, moe_experts

__all__ = ["ACCUMULATION_ERROR", "INPUT_ERROR", "HostExperts", "gemv", "gemv_pairs", "input_error", "moe_experts",
           "quantize_rows", "supported"]
