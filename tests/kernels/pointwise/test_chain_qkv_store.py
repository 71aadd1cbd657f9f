"""The chained q/k/v launch (kernels/pointwise/chain_qkv_store.py) against the two launches it chains: the stacked
q/k/v `quant_matvec` at the same tile, then `_qk_norm_rope_store_kernel` (at the chain's warps: compiled, a sum
follows them), byte for byte, q and the stored keys and values, dense and paged; with the matvec's done-count held
back, the store items wait (give up under SPIN_LIMIT) instead of reading unfinished rows."""

import pytest
import torch

from strata.bench.moe_decode import synthetic_stack
from strata.kernels.attention.paged import PagedKV
from strata.kernels.moe.chain_moe import GAVE_UP, O_DONE, phase_tile, site_counters
from strata.kernels.moe.gemv import ExpertOperand
from strata.kernels.pointwise.chain_qkv_store import chain_qkv_store
from strata.kernels.pointwise.qk_norm_rope_store import (_qk_norm_rope_store_kernel, dense_target, paged_target,
                                                         store_args)
from strata.kernels.quant.matvec import quant_matvec
from tests.kernels.pointwise.common import DEVICE, rand

HEADS = (4, 2, 64)  # query heads, KV heads, head dim (a multiple of the paged pool's 64-value groups)
EMBD, CELLS = 64, 16


def _case(rows: int, seed: int):
    n_out = (HEADS[0] + 2 * HEADS[1]) * HEADS[2]
    weight = synthetic_stack("Q8_0", "Q8_0", 1, EMBD, n_out, seed=seed, device=DEVICE).gate  # [1, n_out, EMBD]
    qkv = ExpertOperand(weight.raw.contiguous().reshape(-1), int(weight.ggml_type), n_out, EMBD, stride=0)
    x = rand((rows, EMBD), seed + 1, torch.bfloat16)
    norms = (1 + 0.1 * rand((HEADS[2],), seed + 2, torch.float32)).bfloat16(), rand((HEADS[2],), seed + 3,
                                                                                   torch.bfloat16)
    angle = rand((rows, HEADS[2] // 2), seed + 4, torch.float32)
    cos, sin = (torch.cat([f(angle)] * 2, -1).bfloat16() for f in (torch.cos, torch.sin))
    positions = torch.arange(3, 3 + rows, device=DEVICE)
    return qkv, weight, x, norms, cos, sin, positions


def _two_launches(qkv, weight, x, norms, cos, sin, target, warps, tile):
    out = quant_matvec(x, weight.raw[0], weight.ggml_type, (qkv.rows, qkv.cols), config=tile)
    n_heads, n_kv_heads, dim = HEADS
    q, k, v = out.split([n_heads * dim, n_kv_heads * dim, n_kv_heads * dim], dim=-1)
    q, k, v = q.view(-1, n_heads, dim), k.view(-1, n_kv_heads, dim), v.view(-1, n_kv_heads, dim)
    args, constants, q_out = store_args(q, k, v, *norms, 1e-6, cos, sin, *target)
    _qk_norm_rope_store_kernel[(x.shape[0], n_heads + n_kv_heads)](*args, **constants, num_warps=warps)
    return q_out, out


def _dense(rows: int):
    keys, values = (torch.zeros(CELLS, HEADS[1], HEADS[2], dtype=torch.float16, device=DEVICE) for _ in range(2))
    return keys, values


@pytest.mark.parametrize("rows", [1, 3])
def test_chained_qkv_store_gives_the_two_launches_bytes_dense(rows):
    qkv, weight, x, norms, cos, sin, positions = _case(rows, 40 + rows)
    tile = phase_tile("matvec", qkv, 0, 1, x.is_cuda)
    want_cache, got_cache = _dense(rows), _dense(rows)
    want_q, want_out = _two_launches(qkv, weight, x, norms, cos, sin,
                                     dense_target(HEADS[1:], *want_cache, positions), tile.warps, tile)
    buffers = {}
    got_q = chain_qkv_store(x, qkv, HEADS, *norms, 1e-6, cos, sin, dense_target(HEADS[1:], *got_cache, positions),
                            site="qkv dense", buffers=buffers)
    assert torch.equal(buffers["qkv"], want_out) and torch.equal(got_q, want_q)
    assert all(torch.equal(a, b) for a, b in zip(got_cache, want_cache)) and want_cache[0].abs().sum() > 0
    assert not site_counters(x.device, "qkv dense").any()


def test_chained_qkv_store_gives_the_two_launches_bytes_paged():
    qkv, weight, x, norms, cos, sin, positions = _case(2, 50)
    tile = phase_tile("matvec", qkv, 0, 1, x.is_cuda)
    pools = [PagedKV.empty(8, HEADS[1], HEADS[2], int8=True, device=DEVICE) for _ in range(2)]
    table = torch.arange(8, dtype=torch.int32, device=DEVICE)
    want_q, _ = _two_launches(qkv, weight, x, norms, cos, sin, paged_target(HEADS[1:], pools[0], table, positions),
                              tile.warps, tile)
    got_q = chain_qkv_store(x, qkv, HEADS, *norms, 1e-6, cos, sin, paged_target(HEADS[1:], pools[1], table, positions),
                            site="qkv paged")
    assert torch.equal(got_q, want_q)
    for name in ("k", "v", "k_scale", "v_scale"):
        assert torch.equal(getattr(pools[1], name), getattr(pools[0], name)), name
    assert pools[0].k.abs().sum() > 0


def test_store_items_wait_for_every_matvec_item():
    qkv, weight, x, norms, cos, sin, positions = _case(2, 60)
    counters = site_counters(x.device, "qkv held back")
    counters[O_DONE.value] = -1  # one matvec item never counted
    cache = _dense(2)
    chain_qkv_store(x, qkv, HEADS, *norms, 1e-6, cos, sin, dense_target(HEADS[1:], *cache, positions),
                    site="qkv held back", spin_limit=3 if DEVICE == "cpu" else 20000)
    assert int(counters[GAVE_UP.value]) == 2 * (HEADS[0] + HEADS[1])  # every store item
    counters[GAVE_UP.value] = 0
    assert not counters.any()
    assert not any(c.any() for c in cache)  # nothing stored from unfinished rows
