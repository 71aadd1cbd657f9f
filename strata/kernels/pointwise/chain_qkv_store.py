"""An attention layer's q/k/v projection and its q/k norm + RoPE + KV store in ONE launch (STRATA_DECODE_CHAIN):
the stacked q/k/v matvec (`quant_matvec`: the one-shot dense program) then `_qk_norm_rope_store_kernel`'s programs,
chained by counters as kernels/moe/chain_moe.py chains an MoE layer (see there: tickets taken in order, waits only
for smaller tickets, the counters zeroed by the last program, a site's launches a step apart).

- matvec item (a row tile of the stacked weight): loads its rows, waits for the predecessor (PDL), multiplies the
  normed rows x, counts itself done;
- store item (token, head: query heads first, then key heads): waits for every matvec item, then the norm + RoPE
  (+ the key's and value's store) kernel's body, reading q, k and v as column slices of the matvec's output.

Each phase is its kernel's body, so the bytes are `quant_matvec` then `qk_norm_rope_store_*`'s under the
interpreter (compiled: at the chain's warp count, see chain_moe). The matvec's items stream their weights before
the wait, as the unchained matvec does under PDL.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels.moe import gemv
from strata.kernels.moe.chain_moe import (DEFAULT, FINISHED, GAVE_UP, O_DONE, TICKET, ChainConfig, _prefixed,
                                          _wait_for, dense_matvec_item, phase_tile, site_counters)
from strata.kernels.pdl import launch_options, pdl_start, pdl_wait
from strata.kernels.pointwise.qk_norm_rope_store import qk_norm_rope_store_item, store_args

MATVEC_DONE = O_DONE  # the counter the matvec items count on (the same layout as chain_moe's)


@triton.jit
def _chain_qkv_store_kernel(x_ptr, w, ones_ptr, qkv_ptr, q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr,
                            q_out, pos_ptr, page_table_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, n_heads, n_kv_heads,
                            q_token_stride, q_head_stride, k_token_stride, v_token_stride, eps, counters,
                            T: tl.constexpr, HEADS: tl.constexpr, DIM: tl.constexpr, HALF: tl.constexpr,
                            BLOCK: tl.constexpr, PAGED: tl.constexpr, INT8: tl.constexpr,
                            M_N_OUT: tl.constexpr, M_K: tl.constexpr, M_FMT: tl.constexpr, M_N_UNITS: tl.constexpr,
                            M_UNIT_W: tl.constexpr, M_NT: tl.constexpr, M_BN: tl.constexpr, M_NU: tl.constexpr,
                            M_PER: tl.constexpr, M_BLOCK_BYTES: tl.constexpr, M_UNITS_PER_BLOCK: tl.constexpr,
                            SPIN_LIMIT: tl.constexpr = 0, NAP: tl.constexpr = 0, PDL: tl.constexpr = 0):
    pdl_start(PDL)
    M_ITEMS: tl.constexpr = (M_N_OUT + M_BN - 1) // M_BN
    ITEMS: tl.constexpr = M_ITEMS + T * HEADS
    item = tl.atomic_add(counters + TICKET, 1, sem="relaxed", scope="gpu")  # (a site's launches: a step apart)
    if item < M_ITEMS:  # the dense matvec's program: its rows' weights, the wait, then x
        dense_matvec_item(item, w, x_ptr, ones_ptr, qkv_ptr, counters + MATVEC_DONE, M_BN, M_NT, M_PER, M_N_UNITS,
                          M_NU, M_N_OUT, M_K, M_FMT, M_BLOCK_BYTES, M_UNITS_PER_BLOCK, M_UNIT_W, T, PDL)
    else:
        pdl_wait(PDL)
        s_item = item - M_ITEMS
        if _wait_for(counters + MATVEC_DONE, M_ITEMS, counters + GAVE_UP, SPIN_LIMIT, NAP):
            qk_norm_rope_store_item((s_item // HEADS).to(tl.int64), s_item % HEADS, q_ptr, k_ptr, v_ptr, qw_ptr,
                                    kw_ptr, cos_ptr, sin_ptr, q_out, pos_ptr, page_table_ptr, kc_ptr, vc_ptr, ks_ptr,
                                    vs_ptr, n_heads, n_kv_heads, q_token_stride, q_head_stride, k_token_stride,
                                    v_token_stride, eps, DIM, HALF, BLOCK, PAGED, INT8)
    tl.debug_barrier()
    if tl.atomic_add(counters + FINISHED, 1, sem="acq_rel", scope="gpu") == ITEMS - 1:
        tl.store(counters + TICKET, 0)  # every other program is past its last use of the counters
        tl.store(counters + FINISHED, 0)
        tl.store(counters + MATVEC_DONE, 0)


def chain_qkv_store(x: torch.Tensor, qkv, heads: tuple[int, int, int], q_weight: torch.Tensor,
                    k_weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor, target: tuple, site,
                    config: ChainConfig = DEFAULT, spin_limit: int = 0, buffers: dict | None = None):
    """x [T, D] (normed, bf16/fp16), `qkv` (a gemv.ExpertOperand at stride 0: the stacked q, k, v rows [(H + 2 Hkv)
    * dim, D]), heads (H, Hkv, dim), the norm weights, eps, cos/sin [T, dim] and a store `target`
    (qk_norm_rope_store.dense_target / paged_target) -> q normed and turned [T, H, dim], the turned keys and the
    values stored: what `quant_matvec(x, qkv)`, split, then `qk_norm_rope_store_*` give, in one launch; None where
    the chain does not apply (T > quant.matvec.MAX_ROWS, tiles). `buffers` (tests): "qkv", the matvec's output."""
    from strata.kernels.moe.oneshot_gemv import _constants
    from strata.kernels.quant.matvec import MAX_ROWS, one_expert

    n_heads, n_kv_heads, dim = heads
    n_tokens = x.shape[0]
    if not (1 <= n_tokens <= MAX_ROWS and qkv.stride == 0 and qkv.rows == (n_heads + 2 * n_kv_heads) * dim
            and x.shape[1] == qkv.cols):
        return None
    tile = phase_tile("matvec", qkv, config.o_bn, 1, x.is_cuda, config)
    if tile is None or not (gemv._takes_words(tile, qkv) and gemv._takes_oneshot(tile, qkv)):
        return None
    counters = site_counters(x.device, site)
    if counters is None:
        return None
    buffers = {} if buffers is None else buffers
    out = buffers.setdefault("qkv", torch.empty(n_tokens, qkv.rows, dtype=x.dtype, device=x.device))
    q, k, v = out.split([n_heads * dim, n_kv_heads * dim, n_kv_heads * dim], dim=-1)
    q, k, v = q.view(n_tokens, n_heads, dim), k.view(n_tokens, n_kv_heads, dim), v.view(n_tokens, n_kv_heads, dim)
    args, constants, q_out = store_args(q, k, v, q_weight, k_weight, eps, cos, sin, *target)
    # The store phase must read the matvec's output itself, not a copy made before the launch writes it.
    assert [a.data_ptr() for a in args[:3]] == [t.data_ptr() for t in (q, k, v)]
    matvec = _prefixed("M_", _constants(qkv.spec, qkv.rows, qkv.cols, 1, False, tile.bn, 1))
    items = triton.cdiv(qkv.rows, tile.bn) + n_tokens * (n_heads + n_kv_heads)
    _chain_qkv_store_kernel[(items,)](
        x.contiguous(), qkv.raw, one_expert(x.device, n_tokens)[1], out, *args, counters, T=n_tokens,
        HEADS=n_heads + n_kv_heads, **constants, **matvec, SPIN_LIMIT=spin_limit, NAP=config.nap_ns,
        num_warps=tile.warps, **launch_options(x))
    return q_out
