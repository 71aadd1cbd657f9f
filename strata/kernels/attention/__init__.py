"""Attention kernels: the paged int8/fp16 KV pool, prompt attention (fp32, v1, v2, v2t, IMMA), decode attention."""
