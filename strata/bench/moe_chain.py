"""Speed and parity of the chained decode launches (STRATA_DECODE_CHAIN) against the launches they replace.

The MoE half (kernels/moe/chain_moe.py) against its five launches (the o projection's quantized matvec,
add_norm_route_triton, the experts' gate/up and down kernels, the layer's closing add_rms_norm_triton) on one
synthetic MoE layer.

Per shape: microseconds per call of each, replayed from a CUDA graph of 32 calls (each with its own activations,
so its own routing, and one of 8 o weights: the weights come from HBM rather than L2), the floor (the distinct
chosen experts' bytes, the router's and the o weight's, over the measured read bandwidth), whether the chained
call gives the bytes of the five launches run at its tiles and warps (delta, residuals, normed rows, routing ids,
the experts' sum: "=" says the chaining reads nothing stale), and the layer's output's (the next norm's x') largest
difference from the default five launches' over its max (compiled, a kernel's sums follow its warp count).
`--sweep` adds a line per ChainConfig (warps, gate/up rows, down rows, matvec rows). Then the attention half: the
stacked q/k/v matvec and the q/k norm + RoPE + store (two launches) against kernels/pointwise/chain_qkv_store.py.

    strata bench moe-chain [--shapes a3b-q4_0,qwen4exp-q2_0] [--tokens 1] [--sweep [W:G:D,...]]
"""

from __future__ import annotations

import argparse
import sys

import torch

import strata.kernels  # noqa: F401  (the interpreter switch, before Triton is imported)
import triton  # noqa: E402  (after it)
from strata.bench.ceilings import graph_us, read_bandwidth
from strata.bench.moe_decode import SHAPES, synthetic_stack
from strata.kernels.moe.chain_moe import (DEFAULT, ChainConfig, chain_moe_triton, chain_tiles, parse_config,
                                          site_counters)
from strata.kernels.moe.gemv import (DecodeExperts, ExpertOperand, down_sum_triton, gate_up_swiglu_triton,
                                     moe_gemv_triton)
from strata.kernels.pointwise.add_norm_route import RouteConfig, add_norm_route_triton
from strata.kernels.pointwise.add_rms_norm import _add_rms_norm_kernel, add_rms_norm_triton
from strata.kernels.quant.matvec import quant_matvec

CALLS = 32  # a graph replay on a GPU; under the interpreter (a smoke run) 2
SHAPES = {**SHAPES, "tiny-q4_0": ("Q4_0", "Q4_0", 128, 64, 8, 2)}  # the CPU smoke test's
# warps : gate/up rows : down rows [: matvec rows] (0: the default's), most telling first (a sweep cut short by its
# cap keeps those): around 8 warps / 8 / 4 / 8, the down kernel's own 16 warps (one program an SM at A3B's shape),
# 4 warps (three), and rows halved or doubled in each phase.
SWEEP = "16:8:8,4:0:0,8:0:0:0:0:100,8:8:8,8:4:4,8:8:2,16:16:8:16,8:8:4:4,8:0:0:0:1,8:0:0:0:16,8:0:0:0:0:500,4:4:2"


def _calls(device) -> int:
    return CALLS if torch.device(device).type == "cuda" else 2


def _launched(out):
    """A chained call's result; a call that declined (None) would leave its timing empty: an error instead."""
    if out is None:
        raise RuntimeError("the chained launch declined a call the bench times")
    return out


def _site(device, site):
    """A call's counters' site, its counters made now: a launch whose counters a capture would have to make
    declines (the graph would then time nothing)."""
    site_counters(torch.device(device), site)
    return site


def parse_configs(text: str) -> list[ChainConfig]:
    return [parse_config(item) for item in text.split(",") if item]


HEADS = {"a3b-q4_0": 4096, "a3b-q4_k": 4096, "qwen4exp-q2_0": 6144, "tiny-q4_0": 256}  # the o projection's inputs
O_MATRICES = 8  # distinct o weights, cycled over the calls (a call's not left in L2 by the one before)


def _layer(shape: str, tokens: int, device):
    """A synthetic layer's experts, norms, router, o weights and the calls' (residual, heads, o operand)."""
    gate_up, down, embd, ff, n_experts, k = SHAPES[shape]
    experts = DecodeExperts.of_stack(synthetic_stack(gate_up, down, n_experts, embd, ff, seed=3, device=device))
    gen = torch.Generator().manual_seed(4)
    norm = (1 + 0.1 * torch.randn(embd, generator=gen)).bfloat16().to(device)
    next_norm = (1 + 0.1 * torch.randn(embd, generator=gen)).bfloat16().to(device)
    router = (torch.randn(n_experts, embd, generator=gen) * 0.05).bfloat16().to(device)
    o_format = gate_up if gate_up in ("Q4_0", "Q8_0", "Q2_0", "Q4_K") else "Q4_0"
    n_heads = HEADS.get(shape, 2 * embd)
    weights = [synthetic_stack(o_format, o_format, 1, n_heads, embd, seed=10 + i, device=device).gate
               for i in range(O_MATRICES)]  # [1, embd rows, n_heads]
    operands = [ExpertOperand(w.raw.contiguous().reshape(-1), int(w.ggml_type), embd, n_heads, stride=0)
                for w in weights]
    # Each call its own counters' site: with the o phase a launch takes its ticket before its PDL wait, which
    # needs the site's previous launch complete (decode: a step apart; here the graph's calls run back to back).
    calls = [((torch.randn(tokens, embd, generator=gen) * 2).bfloat16().to(device),
              torch.randn(tokens, n_heads, generator=gen).bfloat16().to(device), operands[c % O_MATRICES],
              _site(device, ("bench", shape, c))) for c in range(_calls(device))]
    return experts, norm, next_norm, router, calls, k


def _floor_bytes(experts, router, o, ids: torch.Tensor) -> int:
    per_expert = sum(m.rows * m.row_bytes for m in (experts.gate, experts.up, experts.down))
    return (len(set(ids.flatten().tolist())) * per_expert + router.numel() * router.element_size()
            + o.rows * o.row_bytes)


def _matvec(heads, o, config=None):
    return quant_matvec(heads, o.raw, o.qtype, (o.rows, o.cols), config)


def _at_warps(h, heads, o, site, norm, next_norm, router, k, experts, tiles, config):
    """The five launches at the chain's tiles and warps: (residual, x, y, residual after, its norm, ids, delta)."""
    warps = tiles[0].warps
    delta = _matvec(heads, o, tiles[2])
    route = RouteConfig(warps=warps) if not config.route_experts else RouteConfig(config.route_experts, warps)
    residual, x, weights, ids = add_norm_route_triton(h, delta, norm, router, 1e-6, k, True, config=route)
    hid = gate_up_swiglu_triton(x, ids, experts, tiles[0])
    y = down_sum_triton(hid, ids, weights, experts, x.dtype, tiles[1])
    residual2, x2 = torch.empty_like(residual), torch.empty_like(residual)
    _add_rms_norm_kernel[(residual.shape[0],)](residual, y, next_norm, residual2, x2, residual.shape[1], 1e-6,
                                               BLOCK=triton.next_power_of_2(residual.shape[1]), num_warps=warps)
    return residual, x, y, residual2, x2, ids, delta


def bench_shape(shape: str, tokens: int, device, configs: list[ChainConfig], bandwidth: float) -> None:
    experts, norm, next_norm, router, calls, k = _layer(shape, tokens, device)

    def five(h, heads, o, site):
        residual, x, weights, ids = add_norm_route_triton(h, _matvec(heads, o), norm, router, 1e-6, k, True)
        y = moe_gemv_triton(x, ids, weights, experts)
        return residual, x, y, *add_rms_norm_triton(residual, y, next_norm, 1e-6), ids

    def chained(h, heads, o, site, config=DEFAULT, buffers=None):
        return _launched(chain_moe_triton(h, None, norm, router, 1e-6, k, True, experts, site=site, config=config,
                                          next_norm=next_norm, heads=heads, o=o, buffers=buffers))

    want = [five(*c) for c in calls]
    floor_bytes = sum(_floor_bytes(experts, router, c[2], w[5]) for c, w in zip(calls, want)) / len(calls)
    floor_us = floor_bytes / bandwidth * 1e6
    five_us = graph_us(five, calls, device)
    print(f"{shape}, {tokens} token(s): five launches {five_us:7.2f} us  floor {floor_us:6.2f} us "
          f"({100 * floor_us / five_us:4.1f} % of it)")
    for config in configs:
        tiles = chain_tiles(experts, k, torch.device(device).type == "cuda", config, calls[0][2])
        if tiles is None:
            print(f"  {config}: the chain does not apply (tiles)")
            continue
        same, worst = True, 0.0
        for c, w in zip(calls[:4], want):
            buffers = {}
            got = chained(*c, config, buffers)
            at_warps = _at_warps(*c, norm, next_norm, router, k, experts, tiles, config)
            same &= all(torch.equal(a, b) for a, b in zip((*got, buffers["ids"], buffers["delta"]), at_warps))
            worst = max(worst, ((got[4].float() - w[4].float()).abs().max() / w[4].float().abs().max()).item())
        us = graph_us(lambda h, heads, o, site, cfg=config: chained(h, heads, o, site, cfg), calls, device)
        label = "default " if config == DEFAULT else ""
        print(f"  {label}warps={tiles[0].warps:<2} gate_up_bn={tiles[0].bn:<2} down_bn={tiles[1].bn:<2} "
              f"o_bn={tiles[2].bn:<2} route={config.route_experts or 'default'!s:<7} nap={config.nap_ns:<3} "
              f"{us:7.2f} us  "
              f"{five_us / us:5.2f}x five  {100 * floor_us / us:5.1f} % of floor  "
              f"{'=' if same else '!='} its five launches' bytes, x' {worst:.1e} of max from the default five")


QKV_HEADS = {"a3b-q4_0": (32, 4, 128), "a3b-q4_k": (32, 4, 128), "qwen4exp-q2_0": (24, 2, 256), "tiny-q4_0": (4, 2, 64)}


def bench_qkv(shape: str, tokens: int, device, configs: list[ChainConfig], bandwidth: float) -> None:
    """The attention half: the stacked q/k/v matvec then the q/k norm + RoPE + store into a dense fp16 cache (two
    launches) against kernels/pointwise/chain_qkv_store.py's one, per config (its warps and matvec rows)."""
    from strata.kernels.moe.chain_moe import phase_tile
    from strata.kernels.pointwise.chain_qkv_store import chain_qkv_store
    from strata.kernels.pointwise.qk_norm_rope_store import (_qk_norm_rope_store_kernel, dense_target,
                                                             qk_norm_rope_store_dense, store_args)

    gate_up, _, embd, _, _, _ = SHAPES[shape]
    heads = QKV_HEADS.get(shape)
    if heads is None or tokens > 4:
        return
    n_heads, n_kv_heads, dim = heads
    n_out = (n_heads + 2 * n_kv_heads) * dim
    fmt = gate_up if gate_up in ("Q4_0", "Q8_0", "Q2_0", "Q4_K") else "Q4_0"
    weights = [synthetic_stack(fmt, fmt, 1, embd, n_out, seed=30 + i, device=device).gate for i in range(O_MATRICES)]
    operands = [ExpertOperand(w.raw.contiguous().reshape(-1), int(w.ggml_type), n_out, embd, stride=0)
                for w in weights]
    gen = torch.Generator().manual_seed(5)
    q_weight, k_weight = ((1 + 0.1 * torch.randn(dim, generator=gen)).bfloat16().to(device) for _ in range(2))
    keys, values = (torch.zeros(4096, n_kv_heads, dim, dtype=torch.float16, device=device) for _ in range(2))
    calls = []
    for c in range(_calls(device)):
        angle = torch.randn(tokens, dim // 2, generator=gen)
        cos, sin = (torch.cat([f(angle)] * 2, -1).bfloat16().to(device) for f in (torch.cos, torch.sin))
        calls.append((torch.randn(tokens, embd, generator=gen).bfloat16().to(device), operands[c % O_MATRICES],
                      cos, sin, torch.arange(c * tokens, (c + 1) * tokens, dtype=torch.int32, device=device),
                      _site(device, ("bench qkv", shape, c))))

    def split(out):
        q, k, v = out.split([n_heads * dim, n_kv_heads * dim, n_kv_heads * dim], dim=-1)
        return q.view(-1, n_heads, dim), k.view(-1, n_kv_heads, dim), v.view(-1, n_kv_heads, dim)

    def two(x, o, cos, sin, pos, site, tile=None):
        q, k, v = split(_matvec(x, o, tile))
        if tile is None:
            return qk_norm_rope_store_dense(q, k, v, q_weight, k_weight, 1e-6, cos, sin, keys, values, pos)
        args, constants, q_out = store_args(q, k, v, q_weight, k_weight, 1e-6, cos, sin,
                                            *dense_target(heads[1:], keys, values, pos))
        _qk_norm_rope_store_kernel[(x.shape[0], n_heads + n_kv_heads)](*args, **constants, num_warps=tile.warps)
        return q_out

    def chained(x, o, cos, sin, pos, site, config=DEFAULT):
        return _launched(chain_qkv_store(x, o, heads, q_weight, k_weight, 1e-6, cos, sin,
                                         dense_target(heads[1:], keys, values, pos), site, config))

    floor_us = operands[0].rows * operands[0].row_bytes / bandwidth * 1e6
    two_us = graph_us(two, calls, device)
    print(f"{shape} q/k/v + norm + RoPE + store, {tokens} token(s): two launches {two_us:7.2f} us  floor "
          f"{floor_us:6.2f} us")
    seen = set()
    for config in configs:
        tile = phase_tile("matvec", operands[0], config.o_bn, 1, torch.device(device).type == "cuda", config)
        if tile is None or (tile.warps, tile.bn) in seen:  # (only warps and the matvec's rows change this launch)
            continue
        seen.add((tile.warps, tile.bn))
        same = True
        for c in calls[:4]:
            want = two(*c, tile)
            want_keys = keys[c[4].long()].clone()
            same &= torch.equal(chained(*c, config), want) and torch.equal(keys[c[4].long()], want_keys)
        us = graph_us(lambda *c, cfg=config: chained(*c, cfg), calls, device)
        print(f"  {'default ' if config == DEFAULT else ''}warps={tile.warps:<2} matvec_bn={tile.bn:<2} {us:7.2f} us  "
              f"{two_us / us:5.2f}x two  {100 * floor_us / us:5.1f} % of floor  "
              f"{'=' if same else '!='} its two launches' bytes (q, keys)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="strata bench moe-chain", description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="a3b-q4_0,qwen4exp-q2_0", help=f"comma-separated, of {', '.join(SHAPES)}")
    p.add_argument("--tokens", type=int, default=1, help="tokens a call (1: decode; a verify window's T)")
    p.add_argument("--sweep", nargs="?", const=SWEEP, default="",
                   help="time these configs (WARPS:GATE_UP_BN:DOWN_BN[:O_BN[:ROUTE_EXPERTS[:NAP_NS]]], "
                   "comma-separated; "
                   "0: the default's) too")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the CPU: the interpreter, a smoke run
    print(torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (interpreted: times mean nothing)")
    bandwidth = read_bandwidth(device)
    configs = [DEFAULT] + [c for c in parse_configs(args.sweep) if c != DEFAULT]
    for shape in args.shapes.split(","):
        bench_shape(shape, args.tokens, device, configs, bandwidth)
        bench_qkv(shape, args.tokens, device, configs, bandwidth)
    return 0


if __name__ == "__main__":
    sys.exit(main())
