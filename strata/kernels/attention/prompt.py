"""Prompt attention over selected cells: the variant picked by switch and GPU, or the reference on the CPU.

| variant | pool        | when                                                   |
|---------|-------------|--------------------------------------------------------|
| fp32    | int8, fp16  | `STRATA_PROMPT_ATTN_OLD=1`                             |
| v1      | int8, fp16  | fp16 pools                                             |
| v2      | int8        | the default, sm_80+                                    |
| v2t     | int8        | `STRATA_PA_V2T=1`; automatically below sm_80           |
| imma    | int8        | `STRATA_PROMPT_ATTN_IMMA=1`, sm_80+                    |
With every switch unset the default path (v2) and its output bytes are unchanged. v2, v2t and imma are blocked
(prompt_blocks.py: a program takes several queries x query heads and reads their shared cells once); their tunables
are the variant's `DEFAULT` config, or `STRATA_PA_CONFIG`.
"""

from __future__ import annotations

import torch

from strata import switches
from strata.kernels import capability
from strata.kernels.attention.paged import PagedKV
from strata.kernels.attention.prompt_fp32 import prompt_attn_fp32
from strata.kernels.attention.prompt_imma import prompt_attn_imma
from strata.kernels.attention.prompt_ref import prompt_attn_ref
from strata.kernels.attention.prompt_v1 import prompt_attn_v1
from strata.kernels.attention.prompt_v2 import prompt_attn_v2, prompt_attn_v2t

VARIANTS = {"fp32": prompt_attn_fp32, "v1": prompt_attn_v1, "v2": prompt_attn_v2, "v2t": prompt_attn_v2t,
            "imma": prompt_attn_imma}


def pick_prompt_variant(cap: tuple[int, int], int8: bool = True) -> str:
    """The prompt kernel for a GPU of compute capability `cap` and a pool kind, by the switches."""
    if switches.get("STRATA_PROMPT_ATTN_OLD"):
        return "fp32"
    if not int8:
        return "v1"
    if cap < (8, 0):
        return "v2t"
    if switches.get("STRATA_PROMPT_ATTN_IMMA"):
        return "imma"
    return "v2t" if switches.get("STRATA_PA_V2T") else "v2"


def prompt_attention(q: torch.Tensor, pool: PagedKV, page_table: torch.Tensor, ids: torch.Tensor,
                     width: torch.Tensor, sm_scale: float | None = None, variant: str | None = None,
                     reference: bool | None = None) -> torch.Tensor:
    """Attention [n_q, H, D] fp32 of queries `q` [n_q, H, D] over their selected cells `ids[:, :width]`.

    `reference` (default: on the CPU) takes the torch reference in fp32; otherwise `variant` (default: by switch and
    capability) names the kernel.
    """
    if reference if reference is not None else not q.is_cuda:
        return prompt_attn_ref(q, pool, page_table, ids, width, sm_scale, dtype=torch.float32)
    variant = variant or pick_prompt_variant(capability(q), pool.int8)
    return VARIANTS[variant](q, pool, page_table, ids, width, sm_scale)
