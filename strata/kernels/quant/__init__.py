"""Kernels on GGUF-quantized dense weights (the routed experts' kernels live in kernels/moe)."""
