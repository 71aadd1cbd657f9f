"""QSA block scores: `score[q, b] = sum over indexer heads h of relu(q_idx[q, h] . key[b])`, in fp32.

For a query with `n_kv` cells, blocks `b < n_bid = n_kv // 4` use their pooled keys; the tail block `b = n_bid` uses
the `dead` key plus 1e9 when `n_kv % 4 != 0` (so its newest cells are always selected); later blocks get -inf.
The output has `n_blocks + 1` columns (the pooled keys plus one tail). The Triton kernel computes the same sums as a
GEMM (3xTF32 on the GPU, as the upstream tensor-core kernel does): equal up to fp32 rounding, not bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import strata.kernels  # noqa: F401  (the interpreter switch, before Triton compiles anything)

TAIL_BONUS = 1e9
ROW_EXACT_QUERIES = 4  # up to a verify window's rows (models/weights.py ROW_BY_ROW_MAX_ROWS)


def block_scores_ref(q_idx: torch.Tensor, keys: torch.Tensor, dead: torch.Tensor, n_kv: torch.Tensor) -> torch.Tensor:
    """Scores [n_q, n_blocks + 1] (fp32) of queries `q_idx` [n_q, H, Dk] with `n_kv` [n_q] cells in view."""
    all_keys = torch.cat([keys.float(), dead.float()[None]])
    queries = q_idx.float()
    if queries.shape[0] <= ROW_EXACT_QUERIES:
        # einsum folds the rows into one GEMM whose summation order may change with their count: a verify window's
        # row would then score its blocks unlike plain decoding's one-row step (tests/kernels/select/test_select.py)
        raw = torch.cat([torch.einsum("qhd,bd->qhb", queries[r:r + 1], all_keys) for r in range(queries.shape[0])])
    else:
        raw = torch.einsum("qhd,bd->qhb", queries, all_keys)
    scores = raw.relu().sum(1)
    n_kv = n_kv.long().to(q_idx.device)
    n_bid = n_kv // 4
    b = torch.arange(all_keys.shape[0], device=q_idx.device)[None]
    tail = scores[:, -1] + torch.where(n_kv % 4 != 0, TAIL_BONUS, 0.0)
    scores = torch.where(b < n_bid[:, None], scores, float("-inf"))
    return scores.scatter(1, n_bid[:, None], tail[:, None].float())


@triton.jit
def _block_scores_kernel(q_ptr, keys_ptr, dead_ptr, n_kv_ptr, out_ptr, n_q, n_blocks,
                         H: tl.constexpr, DK: tl.constexpr, BQ: tl.constexpr, TILE: tl.constexpr,
                         PRECISION: tl.constexpr):
    qb = tl.program_id(0) * BQ
    b = tl.program_id(1) * TILE + tl.arange(0, TILE)
    rows = tl.arange(0, BQ * H)  # (query, head) pairs: the GEMM's M
    d = tl.arange(0, DK)
    q_ok = qb + rows // H < n_q
    q = tl.load(q_ptr + (qb * H + rows)[:, None] * DK + d[None, :], mask=q_ok[:, None], other=0.0)
    keys = tl.load(keys_ptr + b[None, :] * DK + d[:, None], mask=b[None, :] < n_blocks, other=0.0)
    per_head = tl.maximum(tl.dot(q, keys, input_precision=PRECISION), 0.0)
    scores = tl.sum(tl.reshape(per_head, (BQ, H, TILE)), axis=1)
    dead = tl.load(dead_ptr + d)
    tail = tl.sum(tl.reshape(tl.maximum(tl.sum(q * dead[None, :], axis=1), 0.0), (BQ, H)), axis=1)
    qi = qb + tl.arange(0, BQ)
    n_kv = tl.load(n_kv_ptr + qi, mask=qi < n_q, other=0)
    n_bid = n_kv // 4
    tail = tail + tl.where(n_kv % 4 != 0, 1e9, 0.0)
    out = tl.where(b[None, :] < n_bid[:, None], scores, float("-inf"))
    out = tl.where(b[None, :] == n_bid[:, None], tail[:, None], out)
    tl.store(out_ptr + qi[:, None] * (n_blocks + 1) + b[None, :], out,
             mask=(qi[:, None] < n_q) & (b[None, :] <= n_blocks))


def block_scores_triton(q_idx: torch.Tensor, keys: torch.Tensor, dead: torch.Tensor, n_kv: torch.Tensor,
                        precision: str = "tf32x3") -> torch.Tensor:
    """`block_scores_ref` as one Triton launch."""
    n_q, n_heads, dk = q_idx.shape
    n_blocks = keys.shape[0]
    out = torch.empty(n_q, n_blocks + 1, dtype=torch.float32, device=q_idx.device)
    bq, tile = max(1, 16 // n_heads), 64
    grid = (triton.cdiv(n_q, bq), triton.cdiv(n_blocks + 1, tile))
    _block_scores_kernel[grid](q_idx.float().contiguous(), keys.float().contiguous(), dead.float().contiguous(),
                               n_kv.to(torch.int32).contiguous(), out, n_q, n_blocks, H=n_heads, DK=dk, BQ=bq,
                               TILE=tile, PRECISION=precision, num_warps=4)
    return out


def block_scores(q_idx: torch.Tensor, keys: torch.Tensor, dead: torch.Tensor, n_kv: torch.Tensor) -> torch.Tensor:
    """Block scores: the Triton kernel on the GPU, the reference on the CPU."""
    return (block_scores_triton if q_idx.is_cuda else block_scores_ref)(q_idx, keys, dead, n_kv)
