"""STRATA_DECODE_TURN: the decode step's q/k norm + RoPE and its key/value store inside the one-launch attention
(decode_short.py), one launch a layer fewer than `qk_norm_rope_store_dense` (or `_paged`: the int8 pool, cells in
order) followed by the attention.

Each program turns its query rows from the projection's raw output, as `qk_norm_rope_store` does (the same roundings;
each row's sum of squares reduced in another order, so a value may sit one step of the dtype away). The one program
whose cells hold the step's position turns its KV head's new key, stores it and the value at that cell, and reads
them back after a CTA barrier (no other program reads that cell). Holding the new cell in registers through the
loop instead, to swap it into the chunk that holds it, took 254 registers in the sm_90 build against 96. One query
row a launch (a decode step): a verify window's rows read each other's new keys, so it keeps the two launches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from strata.kernels.pointwise.qk_norm_rope_store import _turned, store_key_value


@dataclass(frozen=True)
class Turn:
    """The step's raw key and value rows [1, Hkv, D] and what turns them and the queries (the model's `QKNorm`)."""

    k: torch.Tensor
    v: torch.Tensor
    q_weight: torch.Tensor
    k_weight: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    eps: float

    def takes(self, q: torch.Tensor) -> bool:
        """Whether the launch can turn q [1, H, D]: one row, half-precision rows of D contiguous values, RoPE over at
        most the head."""
        one = q.shape[0] == 1 and self.k.shape[0] == 1 and self.v.shape[0] == 1
        halves = q.dtype in (torch.float16, torch.bfloat16) and self.k.dtype == self.v.dtype == q.dtype
        rows = all(t.stride(-1) == 1 and t.stride(-2) == t.shape[-1] for t in (q, self.k, self.v))
        return one and halves and rows and self.cos.shape[-1] <= q.shape[-1]

    def constants(self) -> dict:
        """The kernel's constexprs for it."""
        return dict(TURN=True, HALF=self.cos.shape[-1] // 2)

    def arguments(self) -> dict:
        """The kernel's keyword arguments past its usual ones."""
        return dict(turn_k_ptr=self.k, turn_v_ptr=self.v, qw_ptr=self.q_weight.contiguous(),
                    kw_ptr=self.k_weight.contiguous(), cos_ptr=self.cos.contiguous(), sin_ptr=self.sin.contiguous(),
                    eps=self.eps)


@triton.jit
def turned_queries(q_ptr, head, live, qw_ptr, cos_ptr, sin_ptr, eps, D: tl.constexpr, HALF: tl.constexpr, dtype):
    """Rows `head` [BM] (those `live`) of the raw queries, normed and turned: [BM, D] float32 holding dtype values
    (dead rows zero)."""
    d = tl.arange(0, D)
    rows = q_ptr + tl.where(live, head, 0)[:, None] * D  # dead rows read row 0 (in bounds) and are zeroed after
    x = tl.load(rows + d[None, :]).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
    q = _turned(rows, qw_ptr, cos_ptr, sin_ptr, d[None, :], inv[:, None], D, HALF, dtype)
    return tl.where(live[:, None], q, 0.0)


@triton.jit
def turn_and_store(k_ptr, v_ptr, kvh, kw_ptr, cos_ptr, sin_ptr, eps, k_cache, v_cache, ks_cache, vs_cache,
                   page_table_ptr, pos, n_kv_heads, D: tl.constexpr, HALF: tl.constexpr, dtype, PAGED: tl.constexpr,
                   INT8: tl.constexpr):
    """KV head kvh's new key, normed and turned, and its raw value into the cache at cell `pos`, as
    `qk_norm_rope_store` stores them (its `store_key_value`)."""
    row = k_ptr + kvh * D
    x = tl.load(row + tl.arange(0, D)).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    store_key_value(row, kw_ptr, cos_ptr, sin_ptr, inv, v_ptr + kvh * D, pos, kvh, n_kv_heads, page_table_ptr,
                    k_cache, v_cache, ks_cache, vs_cache, D, HALF, D, PAGED, INT8, dtype)


def supported(q: torch.Tensor, turn: Turn, dense: bool, in_order: bool, by_span: bool) -> bool:
    """Whether a decode_short launch takes `turn`: one query row over a dense cache (not split by span) or over a
    paged pool's cells in order (no selection: the step's position is the row's last cell)."""
    return (dense or in_order) and not by_span and turn.takes(q)
