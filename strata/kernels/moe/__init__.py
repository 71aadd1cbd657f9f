"""Routed experts of a prompt chunk: token grouping on the GPU and three expert paths (fp16, int8 MMQ, fused int8).

The engine calls `moe_prefill(x, topk_ids, topk_weights, stack)`; the switches pick the path (`prompt_expert_path`).
"""

from strata.kernels.moe.prefill import PATHS, PromptExperts, moe_prefill, prompt_expert_path

__all__ = ["PATHS", "PromptExperts", "moe_prefill", "prompt_expert_path"]
