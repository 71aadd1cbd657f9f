"""The paged KV pool: pages of 4 cells, one row per (cell, KV head), int8 codes with fp16 scales or fp16 values.

`row = (page_table[cell // 4] * n_kv_heads + kvh) * 4 + cell % 4`; codes `[rows, D]`, scales `[rows, D // 64]`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PAGE = 4
GROUP = 64  # values per int8 scale


@dataclass
class PagedKV:
    """One layer's K and V pools. `k_scale`/`v_scale` are None for an fp16 pool."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    n_kv_heads: int

    @classmethod
    def empty(cls, n_pages: int, n_kv_heads: int, head_dim: int, int8: bool = True,
              device: torch.device | str = "cpu") -> "PagedKV":
        rows = n_pages * n_kv_heads * PAGE
        if head_dim % GROUP:
            raise ValueError(f"head_dim {head_dim} is not a multiple of {GROUP}")
        dtype = torch.int8 if int8 else torch.float16
        k, v = (torch.zeros(rows, head_dim, dtype=dtype, device=device) for _ in range(2))
        if not int8:
            return cls(k, v, None, None, n_kv_heads)
        ks, vs = (torch.zeros(rows, head_dim // GROUP, dtype=torch.float16, device=device) for _ in range(2))
        return cls(k, v, ks, vs, n_kv_heads)

    @property
    def int8(self) -> bool:
        return self.k_scale is not None

    @property
    def head_dim(self) -> int:
        return self.k.shape[1]

    @property
    def n_pages(self) -> int:
        return self.k.shape[0] // (self.n_kv_heads * PAGE)


def kv_rows(page_table: torch.Tensor, cells: torch.Tensor, kvh: int | torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """Pool rows (int64) of logical cells for KV head(s) `kvh` (broadcast against `cells`)."""
    cells = cells.long()
    return (page_table.long()[cells // PAGE] * n_kv_heads + kvh) * PAGE + cells % PAGE

