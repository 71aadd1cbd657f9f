"""Build the chained MoE kernel (kernels/moe/chain_moe.py) for sm_90 without a GPU at the A3B shape (Q4_0, 2048 x
768, 128 experts, top 8; the o projection first and the layer's add + norm last, as decode runs it) with the given
configs, and the chained q/k/v projection + norm + RoPE + store; print each build's registers and spill stack.

Run as a script in a process without TRITON_INTERPRET (test_chain_moe.py does):
`python chain_build.py [WARPS:GATE_UP_BN:DOWN_BN:O_BN:ROUTE:NAP_NS[:PDL] ...]`.
"""

import json
import os
import sys
from types import SimpleNamespace

os.environ.pop("TRITON_INTERPRET", None)
import triton  # noqa: E402,F401  (before strata.kernels, which would switch the interpreter on)

from strata.kernels.moe.chain_moe import ChainConfig, _chain_moe_kernel, launch_shape, phase_tiles  # noqa: E402
from strata.kernels.moe.decode import SPECS  # noqa: E402
from tests.kernels.moe.sm90_build import build  # noqa: E402

SIGNATURE = {"h_ptr": "*bf16", "d_ptr": "*bf16", "nw_ptr": "*bf16", "router_ptr": "*bf16", "res_ptr": "*bf16",
             "x_ptr": "*bf16", "logits_ptr": "*fp32", "weights_ptr": "*fp32", "ids_ptr": "*i32", "n_cols": "i32",
             "n_experts": "i32", "eps": "fp32", "slot_of": "*i32", "wg": "*u8", "wu": "*u8", "wd": "*u8",
             "hid": "*fp32", "y": "*bf16", "stride_g": "i32", "stride_u": "i32", "stride_d": "i32",
             "counters": "*i32", "nw2_ptr": "*bf16", "res2_ptr": "*bf16", "out2_ptr": "*bf16", "a_ptr": "*bf16",
             "wo": "*u8", "ones_ptr": "*fp32"}


def a3b_build(config: ChainConfig, pdl: int, n_embd: int = 2048, n_ff: int = 768, n_experts: int = 128, k: int = 8,
              n_heads_dim: int = 4096):
    spec = SPECS["Q4_0"]
    g = SimpleNamespace(spec=spec, rows=n_ff, cols=n_embd)
    d = SimpleNamespace(spec=spec, rows=n_embd, cols=n_ff)
    o = SimpleNamespace(spec=spec, rows=n_embd, cols=n_heads_dim)
    tiles = phase_tiles(g, d, k, True, config, o)
    constants, warps, _ = launch_shape(1, n_embd, n_experts, k, True, g, d, False, tiles, config, join=True, o=o)
    return build(_chain_moe_kernel, SIGNATURE, {**constants, "SPIN_LIMIT": 0, "PDL": pdl}, num_warps=warps)


QKV_SIGNATURE = {"x_ptr": "*bf16", "w": "*u8", "ones_ptr": "*fp32", "qkv_ptr": "*bf16", "q_ptr": "*bf16",
                 "k_ptr": "*bf16", "v_ptr": "*bf16", "qw_ptr": "*bf16", "kw_ptr": "*bf16", "cos_ptr": "*bf16",
                 "sin_ptr": "*bf16", "q_out": "*bf16", "pos_ptr": "*i32", "page_table_ptr": "*i32", "kc_ptr": "*fp16",
                 "vc_ptr": "*fp16", "ks_ptr": "*fp16", "vs_ptr": "*fp16", "n_heads": "i32", "n_kv_heads": "i32",
                 "q_token_stride": "i32", "q_head_stride": "i32", "k_token_stride": "i32", "v_token_stride": "i32",
                 "eps": "fp32", "counters": "*i32"}


def a3b_qkv_build(config: ChainConfig, pdl: int, n_embd: int = 2048, heads=(32, 4, 128)):
    """The chained q/k/v projection + norm + RoPE + store (kernels/pointwise/chain_qkv_store.py), a dense cache."""
    from strata.kernels.moe.chain_moe import _prefixed, phase_tile
    from strata.kernels.moe.oneshot_gemv import _constants
    from strata.kernels.pointwise.chain_qkv_store import _chain_qkv_store_kernel

    spec = SPECS["Q4_0"]
    n_out = (heads[0] + 2 * heads[1]) * heads[2]
    tile = phase_tile("matvec", SimpleNamespace(spec=spec, rows=n_out, cols=n_embd), config.o_bn, 1, True, config)
    constants = dict(T=1, HEADS=heads[0] + heads[1], DIM=heads[2], HALF=heads[2] // 2, BLOCK=heads[2], PAGED=False,
                     INT8=False, **_prefixed("M_", _constants(spec, n_out, n_embd, 1, False, tile.bn, 1)))
    return build(_chain_qkv_store_kernel, QKV_SIGNATURE, {**constants, "SPIN_LIMIT": 0, "PDL": pdl},
                 num_warps=tile.warps)


if __name__ == "__main__":  # configs as WARPS:GATE_UP_BN:DOWN_BN:O_BN:ROUTE:NAP_NS (0: the default), then PDL (1)
    for arg in sys.argv[1:] or ["0:0:0"]:
        fields = [int(f) for f in arg.split(":")]
        config = ChainConfig(*fields[:6])
        pdl = fields[6] if len(fields) > 6 else 1
        print(json.dumps({**a3b_build(config, pdl), "config": arg, "pdl": pdl}), flush=True)
        print(json.dumps({**a3b_qkv_build(config, pdl), "config": arg, "pdl": pdl}), flush=True)
