"""Small fused kernels of a decode step (RMSNorm, RoPE): one launch where torch takes five to eight, which matters
when a captured token runs thousands of them."""
