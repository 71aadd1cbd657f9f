"""A GatedDeltaNet decode step's causal conv and its gates in one launch.

Per channel: SiLU(the depthwise conv of the K-1 past inputs and the T new rows), the new past (the window's last
K-1 rows) written over the old one in place; and (program 0) per value head beta = sigmoid(b) and
g = decay_rate * softplus(a + dt_bias) in float32. `models.gated_deltanet.causal_conv` and the gates' torch lines
take a cat, a conv, a SiLU, a slice copy, a sigmoid, a softplus and four more pointwise ops for the same.
Rounded where torch rounds: the conv's float32 sum once to the activation dtype, then the SiLU once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Channels a program owns, and its warps: a step reads (K-1+T) x channels values, latency- not bandwidth-bound, so
# enough programs to spread over the SMs (the A3B shape's 8,192 channels: 32 programs of 256) matter most.
BLOCK_CHANNELS = 256
NUM_WARPS = 2
MAX_TOKENS = 8  # decode steps and short windows unroll over their rows; a prompt chunk keeps torch's conv


@triton.jit
def _window_row(past, past_rows, x_ptr, x_stride, cols, mask, r: tl.constexpr, K: tl.constexpr):
    """Row r of the window [past (K-1 rows); x (T rows)] as float32, past rows taken from registers."""
    if r < K - 1:
        return tl.sum(tl.where(past_rows[:, None] == r, past, 0.0), axis=0)
    else:
        return tl.load(x_ptr + (r - (K - 1)) * x_stride + cols, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _conv_step_kernel(x_ptr, w_ptr, past_ptr, out_ptr, b_ptr, a_ptr, dt_bias_ptr, decay_ptr, beta_ptr, g_ptr,
                      n_channels, n_heads, x_stride, b_stride, a_stride,
                      T: tl.constexpr, K: tl.constexpr, PAST_ROWS: tl.constexpr, BLOCK_C: tl.constexpr,
                      BLOCK_H: tl.constexpr):
    pid = tl.program_id(0)
    dtype = out_ptr.dtype.element_ty
    cols = pid * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = cols < n_channels
    past_rows = tl.arange(0, PAST_ROWS)
    # The whole old past in registers before anything is written over it (torch: past.to(x.dtype)).
    past = tl.load(past_ptr + past_rows[:, None] * n_channels + cols[None, :],
                   mask=(past_rows[:, None] < K - 1) & mask[None, :], other=0.0).to(dtype).to(tl.float32)
    for t in tl.static_range(T):
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        for j in tl.static_range(K):
            w = tl.load(w_ptr + cols * K + j, mask=mask, other=0.0).to(dtype).to(tl.float32)
            acc += w * _window_row(past, past_rows, x_ptr, x_stride, cols, mask, t + j, K)
        conv = acc.to(dtype).to(tl.float32)  # torch's conv rounds its float32 sum once
        tl.store(out_ptr + t * n_channels + cols, (conv / (1.0 + tl.exp(-conv))).to(dtype), mask=mask)
    for r in tl.static_range(K - 1):
        row = _window_row(past, past_rows, x_ptr, x_stride, cols, mask, T + r, K)
        tl.store(past_ptr + r * n_channels + cols, row.to(past_ptr.dtype.element_ty), mask=mask)
    if pid == 0:
        heads = tl.arange(0, BLOCK_H)
        hmask = heads < n_heads
        dt_bias = tl.load(dt_bias_ptr + heads, mask=hmask, other=0.0).to(tl.float32)
        decay = tl.load(decay_ptr + heads, mask=hmask, other=0.0).to(tl.float32)
        for t in tl.static_range(T):
            b = tl.load(b_ptr + t * b_stride + heads, mask=hmask, other=0.0).to(tl.float32)
            tl.store(beta_ptr + t * n_heads + heads, 1.0 / (1.0 + tl.exp(-b)), mask=hmask)
            a = tl.load(a_ptr + t * a_stride + heads, mask=hmask, other=0.0).to(tl.float32) + dt_bias
            # torch's softplus: linear past 20, else log1p(e^a), here log(u) * e / (u - 1) with u = 1 + e (rounded):
            # the classic log1p that keeps e's bits where 1 + e alone would lose them.
            e = tl.exp(tl.minimum(a, 20.0))
            u = 1.0 + e
            log1p = tl.where(u == 1.0, e, tl.log(u) * (e / tl.where(u == 1.0, 1.0, u - 1.0)))
            soft = tl.where(a > 20.0, a, log1p)
            tl.store(g_ptr + t * n_heads + heads, decay * soft, mask=hmask)


def conv_step_triton(x: torch.Tensor, weight: torch.Tensor, past: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                     dt_bias: torch.Tensor, decay_rate: torch.Tensor, block_channels: int = BLOCK_CHANNELS,
                     num_warps: int = NUM_WARPS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, C] (bf16/fp16, rows evenly spaced), weight [C, K], past [K-1, C] contiguous (overwritten with the new
    past), b and a [T, Hv], dt_bias and decay_rate [Hv] -> (SiLU(conv) [T, C] in x's dtype, past, beta [T, Hv]
    float32, g [T, Hv] float32)."""
    n_tokens, n_channels = x.shape
    kernel = weight.shape[1]
    n_heads = b.shape[-1]
    if x.stride(-1) != 1:
        x = x.contiguous()
    b = b if b.stride(-1) == 1 else b.contiguous()
    a = a if a.stride(-1) == 1 else a.contiguous()
    out = torch.empty(n_tokens, n_channels, dtype=x.dtype, device=x.device)
    beta = torch.empty(n_tokens, n_heads, dtype=torch.float32, device=x.device)
    g = torch.empty_like(beta)
    grid = (triton.cdiv(n_channels, block_channels),)
    _conv_step_kernel[grid](x, weight.contiguous(), past, out, b, a, dt_bias.contiguous(), decay_rate.contiguous(),
                            beta, g, n_channels, n_heads, x.stride(0), b.stride(0), a.stride(0),
                            T=n_tokens, K=kernel, PAST_ROWS=triton.next_power_of_2(max(kernel - 1, 1)),
                            BLOCK_C=block_channels, BLOCK_H=triton.next_power_of_2(n_heads), num_warps=num_warps)
    return out, past, beta, g
