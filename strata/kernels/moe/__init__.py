"""Routed experts of a prompt chunk: token grouping on the GPU and three expert paths (bf16, int8 MMQ, fused int8)."""
