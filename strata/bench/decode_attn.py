"""Speed and parity of a decode step's attention and the launch before it, at the Qwen3-30B-A3B shape (32 query
heads, 4 KV heads of 128, a bf16 query, an fp16 dense cache or the int8 paged pool): microseconds per call replayed
from a CUDA graph, the byte floor (the cells' keys and values read once at the measured read bandwidth) and the
largest difference from float64 in units of the output's largest value.

    python -m strata.bench.decode_attn [--spans 64,256,...] [--fill 0.6] [--rows 1] [--kv float16|int8]
                                       [--sweep [--sweep-spans 256,512,...]]

Per span: the split-K kernel with its merge (decode.py: what the step ran before session 6), then the one-launch
kernel (decode_short.py) at its default config, where the span is short enough for it; `--sweep` adds one line per
alternative config (decode_short.ShortConfig: cells a program, most programs, chunk, warps, stages, dot precisions,
split by span or by width), each with its ratio to the split-K kernel and to the default. First the launches around
it: q/k norm + RoPE and the KV write (two launches against the one of qk_norm_rope_store.py), and an MoE layer's
add + norm, router and top-k (three against the one of add_norm_route.py, and its configs under --sweep), and a
gated shared expert's join + add + norm (two against the one of shared_gate_add_norm.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys

import torch

import strata.kernels  # noqa: F401  (the interpreter switch, before Triton is imported)
from strata.bench.ceilings import graph_us, read_bandwidth
from strata.kernels.attention.decode import decode_attn_dense_triton, decode_attn_triton
from strata.kernels.attention import decode_short
from strata.kernels.attention.decode_short import DEFAULT
from strata.kernels.attention.paged import PagedKV

_R = dataclasses.replace
SWEEP = [  # around the default (64 cells a program, at most 16 programs per KV head, 4 warps, 2 stages; over a
    # fp16 cache both dots native in chunks of 64, else QK tf32 where exact and PV tf32x3 in chunks of 32)
    _R(DEFAULT, qk="tf32", pv="tf32x3", chunk=32),  # session 15's default over a fp16 cache (no rounding of P)
    _R(DEFAULT, chunk=16), _R(DEFAULT, chunk=32), _R(DEFAULT, chunk=128), _R(DEFAULT, cells=32),
    _R(DEFAULT, cells=32, chunk=16), _R(DEFAULT, cells=128), _R(DEFAULT, cells=256),
    _R(DEFAULT, max_splits=8), _R(DEFAULT, max_splits=32), _R(DEFAULT, cells=32, max_splits=32),
    _R(DEFAULT, warps=2), _R(DEFAULT, warps=8), _R(DEFAULT, stages=1), _R(DEFAULT, stages=3),
    _R(DEFAULT, qk="ieee", pv="ieee"), _R(DEFAULT, qk="tf32x3", pv="tf32x3"), _R(DEFAULT, qk="tf32", pv="tf32"),
    _R(DEFAULT, qk="native", pv="tf32x3"), _R(DEFAULT, by_span=True),
    # longer spans than the default takes: where the one launch stops paying
    _R(DEFAULT, max_splits=32, max_span=8192), _R(DEFAULT, max_splits=64, max_span=16384),
    _R(DEFAULT, cells=128, max_splits=32, max_span=16384),
]
CALLS = 32  # calls per graph replay


@dataclasses.dataclass
class Case:
    """One span's inputs: the queries, the cache (dense keys/values or a paged pool) and the rows' widths."""

    q: torch.Tensor
    width: torch.Tensor
    span: int
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None
    pool: PagedKV | None = None
    table: torch.Tensor | None = None
    ids: torch.Tensor | None = None

    def run(self, out_dtype: torch.dtype | None = None, **options) -> torch.Tensor:
        """The kernel's output in the activation dtype (as the step runs it), or `out_dtype` (fp32: for parity)."""
        out_dtype = out_dtype or self.q.dtype
        if self.pool is None:
            return decode_attn_dense_triton(self.q, self.keys, self.values, self.width, self.span,
                                            out_dtype=out_dtype, **options)
        return decode_attn_triton(self.q, self.pool, self.table, self.ids, self.width, out_dtype=out_dtype, **options)

    def float64(self) -> torch.Tensor:
        """The attention in float64, every row over its own cells 0..width-1."""
        n_q, n_heads, dim = self.q.shape
        if self.pool is None:
            keys, values = self.keys.double(), self.values.double()
        else:
            from strata.kernels.attention.kv_int8 import gather_kv

            cells = torch.arange(self.span, device=self.q.device)
            kv = [gather_kv(self.pool, self.table, cells, h, torch.float64) for h in range(self.pool.n_kv_heads)]
            keys, values = torch.stack([k for k, _ in kv], 1), torch.stack([v for _, v in kv], 1)
        group = n_heads // keys.shape[1]
        out = torch.zeros(self.q.shape, dtype=torch.float64, device=self.q.device)
        for i, w in enumerate(self.width.tolist()):
            k, v = keys[:w].repeat_interleave(group, 1), values[:w].repeat_interleave(group, 1)
            p = (torch.einsum("hd,shd->hs", self.q[i].double(), k) / math.sqrt(dim)).softmax(-1)
            out[i] = torch.einsum("hs,shd->hd", p, v)
        return out

    def bytes_read(self) -> int:
        """The floor's bytes: each row's cells' keys and values, once."""
        cells = int(self.width.sum())
        if self.pool is None:
            return 2 * cells * self.keys[0].numel() * self.keys.element_size()
        row = self.pool.head_dim * (1 + 2 / 64)  # int8 codes and an fp16 scale per 64
        return int(2 * cells * self.pool.n_kv_heads * row)


def make_case(span: int, fill: float, rows: int, kv: str, device, heads=32, kv_heads=4, dim=128) -> Case:
    gen = torch.Generator().manual_seed(span)
    q = (torch.randn(rows, heads, dim, generator=gen) * 2).bfloat16().to(device)
    last = max(1, int(span * fill))
    width = torch.tensor([max(1, last - rows + 1 + i) for i in range(rows)], dtype=torch.int32, device=device)
    if kv != "int8":
        keys = (torch.randn(span, kv_heads, dim, generator=gen) * 1.5).to(getattr(torch, kv)).to(device)
        values = torch.randn(span, kv_heads, dim, generator=gen).to(getattr(torch, kv)).to(device)
        return Case(q, width, span, keys, values)
    from strata.kernels.attention.kv_int8 import append_kv_ref

    n_pages = span // 4 + 1
    pool = PagedKV.empty(n_pages, kv_heads, dim, int8=True, device=device)
    table = torch.randperm(n_pages, generator=gen).int().to(device)
    cells = torch.arange(span, device=device)
    append_kv_ref(pool, table, cells, *(torch.randn(span, kv_heads, dim, generator=gen).to(device) for _ in range(2)))
    ids = cells.int()[None].expand(rows, span).contiguous()  # the static paged view's ids
    return Case(q, width, span, pool=pool, table=table, ids=ids)


def _err(case: Case, want: torch.Tensor, **options) -> float:
    """The kernel's fp32 output against float64 (the bf16 output's rounding would hide the kernel's own error)."""
    got = case.run(out_dtype=torch.float32, **options)
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def bench_attention(spans: list[int], fill: float, rows: int, kv: str, device, sweep: list[int]) -> None:
    bandwidth = read_bandwidth(device, 1 << 30 if device.type == "cuda" else 1 << 24)
    print(f"decode attention, {rows} row(s), {kv} cache, widths ~{fill:.0%} of the span; read bandwidth "
          f"{bandwidth / 1e9:.0f} GB/s; floor = keys + values read once")
    for span in spans:
        case = make_case(span, fill, rows, kv, device)
        want = case.float64()
        floor_us = case.bytes_read() / bandwidth * 1e6
        split_us = graph_us(lambda: case.run(short=None), [()] * CALLS, device)
        print(f"span {span:>6} (width {int(case.width[-1])}, floor {floor_us:6.2f} us): split-K + merge "
              f"{split_us:7.2f} us  {floor_us / split_us:6.1%} of floor  err {_err(case, want, short=None):.1e}")
        default_us = None
        for config in [DEFAULT] + (SWEEP if span in sweep else []):
            if not config.takes(span):
                continue
            failed = len(decode_short._failed)
            err = _err(case, want, short=config)
            if len(decode_short._failed) > failed:  # it said why on stderr; the call ran split-K
                print(f"  {config.label()}: failed to compile")
                continue
            us = graph_us(lambda c=config: case.run(short=c), [()] * CALLS, device)
            if config == DEFAULT:
                default_us = us
            ratio = f"{default_us / us:5.2f}x default" if default_us else "  (no default)"
            print(f"  {'default ' if config == DEFAULT else ''}{config.label():<86} {us:7.2f} us  "
                  f"{floor_us / us:6.1%} of floor  {split_us / us:5.2f}x split-K  {ratio}  err {err:.1e}")


def bench_norm_store(rows: int, device) -> None:
    from strata.kernels.pointwise.qk_norm_rope import qk_norm_rope_triton
    from strata.kernels.pointwise.qk_norm_rope_store import qk_norm_rope_store_dense
    from strata.kernels.pointwise.store_kv import store_kv_triton
    from strata.models.layers import Rope

    gen = torch.Generator().manual_seed(0)
    q, k, v = ((torch.randn(rows, n, 128, generator=gen) * 3).bfloat16().to(device) for n in (32, 4, 4))
    qw, kw = ((1 + 0.1 * torch.randn(128, generator=gen)).bfloat16().to(device) for _ in range(2))
    positions = torch.arange(300, 300 + rows, dtype=torch.int32, device=device)
    cos, sin = Rope(128, 1e6, torch.device(device)).cos_sin(positions, torch.bfloat16)
    keys, values = (torch.zeros(4096, 4, 128, dtype=torch.float16, device=device) for _ in range(2))

    def two():
        q2, k2 = qk_norm_rope_triton(q, k, qw, kw, 1e-6, cos, sin)
        store_kv_triton(keys, values, positions, k2, v)
        return q2

    def one():
        return qk_norm_rope_store_dense(q, k, v, qw, kw, 1e-6, cos, sin, keys, values, positions)

    want, want_keys = two(), keys.clone()
    same = torch.equal(one(), want) and torch.equal(keys, want_keys)
    two_us, one_us = (graph_us(fn, [()] * CALLS, device) for fn in (two, one))
    print(f"q/k norm + RoPE + KV write, {rows} row(s): two launches {two_us:6.2f} us, one {one_us:6.2f} us "
          f"({two_us / one_us:4.2f}x), {'the same bytes' if same else 'BYTES DIFFER'}")


def bench_turn(device, span: int = 256, fill: float = 0.6) -> None:
    """STRATA_DECODE_TURN's one launch (the q/k norm + RoPE and the store inside the attention, decode_turn.py)
    against the store launch then the attention, at A3B's heads over a dense fp16 cache."""
    from strata.kernels.attention.decode_turn import Turn
    from strata.kernels.pointwise.qk_norm_rope_store import qk_norm_rope_store_dense
    from strata.models.layers import Rope

    gen = torch.Generator().manual_seed(4)
    heads, kv_heads, dim = 32, 4, 128
    qkv = (torch.randn(1, (heads + 2 * kv_heads) * dim, generator=gen) * 3).bfloat16().to(device)
    q, k, v = (qkv[:, a * dim:b * dim].view(1, b - a, dim) for a, b in
               ((0, heads), (heads, heads + kv_heads), (heads + kv_heads, heads + 2 * kv_heads)))
    qw, kw = ((1 + 0.1 * torch.randn(dim, generator=gen)).bfloat16().to(device) for _ in range(2))
    pos = torch.tensor([int(span * fill)], dtype=torch.int32, device=device)
    cos, sin = Rope(dim, 1e6, torch.device(device)).cos_sin(pos, torch.bfloat16)
    keys, values = (torch.randn(span, kv_heads, dim, generator=gen).half().to(device) for _ in range(2))
    turn = Turn(k, v, qw, kw, cos, sin, 1e-6)

    def two():
        normed = qk_norm_rope_store_dense(q, k, v, qw, kw, 1e-6, cos, sin, keys, values, pos)
        return decode_attn_dense_triton(normed, keys, values, pos + 1, span, out_dtype=torch.bfloat16)

    def one():
        return decode_attn_dense_triton(q, keys, values, pos + 1, span, out_dtype=torch.bfloat16, turn=turn)

    want, got = two(), one()
    diff = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
    two_us, one_us = (graph_us(fn, [()] * CALLS, device) for fn in (two, one))
    print(f"q/k norm + RoPE + KV write + attention, span {span}, 1 row: two launches {two_us:6.2f} us, one "
          f"(STRATA_DECODE_TURN) {one_us:6.2f} us ({two_us / one_us:4.2f}x), outputs within {diff:.1e} of the "
          f"largest")


def bench_shared_join(rows: int, device, n_embd=2048) -> None:
    """A gated-shared-expert MoE layer's end: the shared gate's join then the add + norm, against one launch."""
    from strata.kernels.pointwise.add_rms_norm import add_rms_norm_triton
    from strata.kernels.pointwise.shared_gate import shared_gate_triton
    from strata.kernels.pointwise.shared_gate_add_norm import shared_gate_add_norm_triton

    gen = torch.Generator().manual_seed(2)
    h, routed, shared, x = ((torch.randn(rows, n_embd, generator=gen) * 2).bfloat16().to(device) for _ in range(4))
    gate, norm = ((torch.randn(n_embd, generator=gen) * 0.05).bfloat16().to(device) for _ in range(2))

    def two():
        return add_rms_norm_triton(h, shared_gate_triton(routed, shared, x, gate), norm, 1e-6)

    def one():
        return shared_gate_add_norm_triton(h, routed, shared, x, gate, norm, 1e-6)

    same = all(torch.equal(a, b) for a, b in zip(two(), one()))
    two_us, one_us = (graph_us(fn, [()] * CALLS, device) for fn in (two, one))
    print(f"shared gate + add + norm, {rows} row(s): two launches {two_us:6.2f} us, one {one_us:6.2f} us "
          f"({two_us / one_us:4.2f}x), {'the same bytes' if same else 'BYTES DIFFER'}")


# (experts a program, warps; 0: the launch's rule)
ROUTE_SWEEP = [(2, 0), (4, 0), (8, 0), (16, 0), (4, 8), (8, 8), (2, 8), (4, 4), (1, 2), (4, 2)]


def bench_route(rows: int, device, sweep: bool, n_embd=2048, n_experts=128, k=8) -> None:
    """An MoE layer's add + norm, router and top-k: the three launches (add_rms_norm_triton, the bf16 router's
    F.linear, route_topk_triton) against the one of add_norm_route.py, per config."""
    from strata.kernels.pointwise.add_norm_route import DEFAULT as ROUTE_DEFAULT
    from strata.kernels.pointwise.add_norm_route import RouteConfig, add_norm_route_triton
    from strata.kernels.pointwise.add_rms_norm import add_rms_norm_triton
    from strata.kernels.pointwise.route_topk import route_topk_triton

    gen = torch.Generator().manual_seed(1)
    h, delta = ((torch.randn(rows, n_embd, generator=gen) * 2).bfloat16().to(device) for _ in range(2))
    norm = (1 + 0.1 * torch.randn(n_embd, generator=gen)).bfloat16().to(device)
    router = (torch.randn(n_experts, n_embd, generator=gen) * 0.02).bfloat16().to(device)

    def three():
        residual, x = add_rms_norm_triton(h, delta, norm, 1e-6)
        return residual, x, *route_topk_triton(torch.nn.functional.linear(x, router), k, True, torch.int32)

    want = three()
    three_us = graph_us(three, [()] * CALLS, device)
    print(f"add + norm, router ({n_experts} x {n_embd}) and top-{k}, {rows} row(s): three launches {three_us:6.2f} us")
    configs = [ROUTE_DEFAULT] + ([RouteConfig(*c) for c in ROUTE_SWEEP] if sweep else [])
    for config in configs:
        got = add_norm_route_triton(h, delta, norm, router, 1e-6, k, True, config=config)
        us = graph_us(lambda c=config: add_norm_route_triton(h, delta, norm, router, 1e-6, k, True, config=c),
                      [()] * CALLS, device)
        same_ids = all(sorted(a) == sorted(b) for a, b in zip(got[3].tolist(), want[3].tolist()))
        print(f"  {'default ' if config == ROUTE_DEFAULT else ''}experts_per_program={config.experts_per_program:<3} "
              f"warps={config.warps or 'auto'!s:<5} {us:6.2f} us  {three_us / us:5.2f}x three  residual "
              f"{'=' if torch.equal(got[0], want[0]) else '!='}  x {'=' if torch.equal(got[1], want[1]) else '!='}  "
              f"experts {'same' if same_ids else 'DIFFER'}  max weight diff "
              f"{(got[2] - want[2]).abs().max().item():.1e}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="strata bench decode-attn", description=__doc__.split("\n")[0])
    p.add_argument("--spans", default="64,256,512,1024,2048,4096,16384,32768", help="comma-separated span buckets")
    p.add_argument("--fill", type=float, default=0.6, help="the last row's width as a fraction of the span")
    p.add_argument("--rows", type=int, default=1, help="query rows (1: decode; a verify window's T)")
    p.add_argument("--kv", default="float16", choices=("float16", "bfloat16", "int8"))
    p.add_argument("--sweep", action="store_true", help="time the one-launch kernel's configs beside the default")
    p.add_argument("--sweep-spans", default="512,1024,2048,8192", help="the spans --sweep times them at")
    args = p.parse_args(argv)
    sweep = [int(s) for s in args.sweep_spans.split(",")] if args.sweep else []
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the CPU: Triton's interpreter, a smoke run
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (interpreted: times mean nothing)"
    print(name + "; err = max|kernel - float64| / max|float64| of the fp32 output")
    bench_norm_store(args.rows, device)  # the quick ones first: a long sweep cut short still leaves them
    if args.rows == 1:
        bench_turn(device)
    bench_route(args.rows, device, bool(sweep))
    bench_shared_join(args.rows, device)
    bench_attention([int(s) for s in args.spans.split(",")], args.fill, args.rows, args.kv, device, sweep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
