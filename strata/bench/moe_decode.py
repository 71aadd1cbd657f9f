"""Speed and parity of the decode expert kernels (`strata.kernels.moe.gemv`) on one synthetic MoE layer.

Shapes: Qwen3-30B-A3B (embd 2048, ff 768, 128 experts, top 8; Q4_0 and Q4_K) and qwen4exp (2560, 640, 512 experts,
top 10; Q2_0), T tokens (1). For each: microseconds per call of the two kernels replayed from a CUDA graph (32 calls
with different routings per replay, so the weights come from HBM rather than L2), the bytes the call must read (the
distinct chosen experts' gate, up and down) over the HBM floor of the same run (`read_bandwidth`), the error
against float64, the same kernels reading expert-cache slots through a slot table, and the current torch path
(`ResidentExperts`: a dequantize and matmul per expert) in the same run. Then a CUDA graph of one call is captured
and replayed with new ids in place, and must match eager calls bit for bit.

    strata bench moe-decode [--shapes a3b-q4_0,a3b-q4_k,qwen4exp-q2_0] [--tokens 1] [--sweep [all|words|stream|oneshot]]
(also qwen4exp-iq2_xs, -iq3_xxs, -iq3_s: i-quant gate/up, Q2_0 down)
"""

from __future__ import annotations

import argparse
import sys
import numpy as np
import torch

import strata.kernels  # noqa: F401  (the interpreter switch, before Triton is imported)
from strata.bench.ceilings import Timer, copy_bandwidth, graph_us
from strata.bench.gemv_sweep import FAMILIES, sweep_configs, time_config
from strata.kernels.moe.gemv import (ERROR_BOUND, DecodeExperts, down_sum_triton, gate_up_swiglu_triton, moe_gemv,
                                     moe_gemv_float64, relative_error)
from strata.quant import get_format, random_blocks

SHAPES = {  # name: (gate/up format, down format, embd, ff, experts, top-k)
    "a3b-q4_0": ("Q4_0", "Q4_0", 2048, 768, 128, 8),
    "a3b-q4_k": ("Q4_K", "Q4_K", 2048, 768, 128, 8),
    "qwen4exp-q2_0": ("Q2_0", "Q2_0", 2560, 640, 512, 10),
    # qwen4exp's i-quant packs: gate/up in an i-quant, down (640 inputs: no whole 256-weight blocks) in Q2_0
    "qwen4exp-iq2_xs": ("IQ2_XS", "Q2_0", 2560, 640, 512, 10),
    "qwen4exp-iq3_xxs": ("IQ3_XXS", "Q2_0", 2560, 640, 512, 10),
    "qwen4exp-iq3_s": ("IQ3_S", "Q2_0", 2560, 640, 512, 10),
}
DEFAULT_SHAPES = "a3b-q4_0,a3b-q4_k,qwen4exp-q2_0"
ROUTINGS = 32  # calls per graph replay, each with its own routing


def synthetic_stack(gate_up: str, down: str, n_experts: int, n_embd: int, n_ff: int, seed: int = 0,
                    device: str | torch.device = "cpu"):
    """An `ExpertStack` of random valid blocks (weights ~ N(0, 0.02)): gate/up [E, ff, embd], down [E, embd, ff]."""
    from strata.engine.experts import ExpertStack
    from strata.models.weights import QuantWeight

    rng = np.random.default_rng(seed)

    def matrix(name: str, qtype: str, rows: int, cols: int) -> QuantWeight:
        fmt = get_format(qtype)
        raw = random_blocks(qtype, n_experts * rows * cols // fmt.block_size, rng, 0.02)
        raw = torch.from_numpy(raw).reshape(n_experts, rows, -1).to(device)
        return QuantWeight(name, fmt.ggml_type, (n_experts, rows, cols), raw)

    return ExpertStack(matrix("ffn_gate_exps", gate_up, n_ff, n_embd), matrix("ffn_up_exps", gate_up, n_ff, n_embd),
                       matrix("ffn_down_exps", down, n_embd, n_ff))


def routing(n_tokens: int, top_k: int, n_experts: int, gen: torch.Generator, shared: int = 0):
    """ids int32 [T, k] (distinct per token; the first `shared` of every token are token 0's) and softmax weights."""
    ids = torch.stack([torch.randperm(n_experts, generator=gen)[:top_k] for _ in range(n_tokens)])
    for t in range(1, n_tokens):
        first = ids[0, :shared]
        rest = [e for e in ids[t].tolist() if e not in first.tolist()][: top_k - shared]
        ids[t] = torch.cat([first, torch.tensor(rest, dtype=ids.dtype)])
    return ids.int(), torch.softmax(torch.randn(n_tokens, top_k, generator=gen), dim=-1)


def slots_of(stack, order: torch.Tensor, n_slots: int):
    """Expert-cache slots holding experts order[:n_slots] (slot i <- expert order[i]), laid out as
    `ExpertCache.admit` does, and the table expert -> slot (-1 for the others)."""
    parts = (stack.gate, stack.up, stack.down)
    slot_bytes = sum(p.raw[0].numel() for p in parts)
    device = stack.gate.raw.device
    slots = torch.zeros(n_slots, slot_bytes, dtype=torch.uint8, device=device)
    table = torch.full((stack.n_experts,), -1, dtype=torch.int32, device=device)
    for slot, e in enumerate(order[:n_slots].tolist()):
        torch.cat([p.raw[e].reshape(-1) for p in parts], out=slots[slot])
        table[e] = slot
    return slots, table


def _read_bytes(stack, ids: torch.Tensor) -> int:
    return ids.unique().numel() * stack.expert_bytes


def bench_shape(name: str, n_tokens: int, device, floor_bw: float, sweep: str | None, out) -> bool:
    """One shape's line; `sweep` (a gemv_sweep family, or None): then its sweep lines."""
    from strata.engine.experts import ResidentExperts

    gu, dn, n_embd, n_ff, n_experts, top_k = SHAPES[name]
    stack = synthetic_stack(gu, dn, n_experts, n_embd, n_ff, seed=1, device=device)
    experts = DecodeExperts.of_stack(stack)
    gen = torch.Generator().manual_seed(2)
    x = [torch.randn(n_tokens, n_embd, generator=gen).to(device, torch.bfloat16) for _ in range(ROUTINGS)]
    routes = [routing(n_tokens, top_k, n_experts, gen, shared=min(2, top_k)) for _ in range(ROUTINGS)]
    ids = [r[0].to(device) for r in routes]
    weights = [r[1].to(device) for r in routes]
    calls = [(x[i], ids[i], weights[i], experts, torch.float32) for i in range(ROUTINGS)]
    n_bytes = sum(_read_bytes(stack, i) for i in ids) / ROUTINGS
    floor_us = n_bytes / floor_bw * 1e6

    y = moe_gemv(*calls[0])
    h64, y64 = moe_gemv_float64(x[0], ids[0], weights[0], experts)
    h = gate_up_swiglu_triton(x[0], ids[0], experts)
    err_h, err_y = relative_error(h, h64), relative_error(y, y64)
    ok = err_h <= ERROR_BOUND and err_y <= ERROR_BOUND

    us = graph_us(moe_gemv, calls, device)
    # The same kernels reading slots (every expert resident, in a shuffled order) through the slot table.
    slots, table = slots_of(stack, torch.randperm(n_experts, generator=gen), n_experts)
    cached = DecodeExperts.of_slots(slots, table, stack)
    y_slots = moe_gemv(x[0], ids[0], weights[0], cached, torch.float32)
    ok &= torch.equal(y_slots, y)
    us_slots = graph_us(moe_gemv, [(a, b, c, cached, d) for a, b, c, _, d in calls], device)
    # The torch path the kernels replace: a dequantize and matmuls per chosen expert, on the host's schedule.
    resident = ResidentExperts({0: stack})
    x32 = x[0].float()
    y_torch = resident.run(0, x32, weights[0], ids[0].long())
    err_torch = relative_error(y_torch, y64)
    timer = Timer(device)
    torch_us = min(timer(lambda: resident.run(0, x32, weights[0], ids[0].long()), 3) for _ in range(2)) * 1e3
    print(f"{name:<14} {n_tokens:>2} {n_bytes / 1e6:8.2f} {floor_us:8.2f} {us:8.2f} {floor_us / us:6.1%} "
          f"{n_bytes / us / 1e3:8.0f} {us_slots:8.2f} {err_y:9.2e} {err_h:9.2e} {torch_us:9.0f} {torch_us / us:7.0f}x"
          f"  {'' if ok else 'FAIL'}", file=out, flush=True)
    if sweep:
        ok &= _sweep(name, experts, calls, device, floor_bw, out, (h64, y64), sweep)
    return ok


def _sweep(name, experts, calls, device, floor_bw, out, want: tuple, family: str = "all") -> bool:
    """Each kernel alone under `gemv_sweep.sweep_configs` (the default first), every line beside the default, with
    its error against `want` = the float64 (H, y) of the first call and whether its output is the default's bytes."""
    top_k = calls[0][1].shape[1]
    g, d = experts.gate, experts.down
    h = [gate_up_swiglu_triton(c[0], c[1], experts) for c in calls]
    ok, outputs = True, {}
    for kind, m, target in (("gate_up", g, want[0]), ("down", d, want[1])):
        per_expert = 2 * g.expert_bytes if kind == "gate_up" else d.expert_bytes
        n_bytes = sum(len(c[1].unique()) for c in calls) / len(calls) * per_expert
        default_us = None
        for cfg in sweep_configs(kind, m.spec, m.rows, m.cols, top_k, family=family):
            if kind == "gate_up":
                fn, args = (lambda a, i, c=cfg: gate_up_swiglu_triton(a, i, experts, c)), [(c[0], c[1]) for c in calls]
            else:
                fn = lambda hh, i, w, c=cfg: down_sum_triton(hh, i, w, experts, torch.float32, c)  # noqa: E731
                args = [(hh, c[1], c[2]) for hh, c in zip(h, calls)]
            good, default_us = time_config(f"{name} {kind}", cfg, fn, args, target, n_bytes, floor_bw, default_us,
                                           device, out, outputs)
            ok &= good
    return ok


def graph_replay_check(device, out) -> bool:
    """Capture one call (both kernels) with static inputs; replay with new ids and weights copied in place."""
    gu, dn, n_embd, n_ff, n_experts, top_k = SHAPES["qwen4exp-q2_0"]
    stack = synthetic_stack(gu, dn, 64, n_embd, n_ff, seed=3, device=device)
    experts = DecodeExperts.of_stack(stack)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(1, n_embd, generator=gen).to(device, torch.bfloat16)
    ids, w = (t.to(device) for t in routing(1, top_k, 64, gen))
    moe_gemv(x, ids, w, experts, torch.float32)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = moe_gemv(x, ids, w, experts, torch.float32)
    worst = 0.0
    for _ in range(4):
        new_ids, new_w = (t.to(device) for t in routing(1, top_k, 64, gen))
        ids.copy_(new_ids)
        w.copy_(new_w)
        x.copy_(torch.randn(1, n_embd, generator=gen).to(device, torch.bfloat16))
        graph.replay()
        eager = moe_gemv(x, ids, w, experts, torch.float32)
        worst = max(worst, (y - eager).abs().max().item())
    ok = worst == 0.0
    print(f"CUDA graph: captured both kernels, replayed with 4 new routings; max |replay - eager| = {worst:g} "
          f"{'(bit-identical)' if ok else 'FAIL'}", file=out, flush=True)
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="strata bench moe-decode", description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"comma-separated, of: {', '.join(SHAPES)}")
    p.add_argument("--tokens", default="1", help="comma-separated T values (1..8)")
    p.add_argument("--sweep", nargs="?", const="all", choices=FAMILIES,
                   help="time each kernel under launch configurations beside the default (bench/gemv_sweep.py); "
                        "'stream': only the streamed kernels' (stream_gemv.py), 'oneshot': only the one-shot kernels' "
                        "(oneshot_gemv.py), 'words': all but those two")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("moe-decode: needs a CUDA GPU (the kernels' CPU tests are tests/kernels/moe/test_gemv.py)")
        return 2
    device = torch.device("cuda")
    out = sys.stdout
    bw = copy_bandwidth(device)
    floor_bw = bw  # ceilings.read_bandwidth: a read-only stream runs at the copy's whole traffic rate
    print(f"{torch.cuda.get_device_name(device)}; copy {bw / 1e12:.2f} TB/s (read + write); floor = bytes / "
          f"{floor_bw / 1e12:.2f} TB/s; error = max|y - float64| / max|float64| (bound {ERROR_BOUND:g})", file=out)
    print(f"{'shape':<14} {'T':>2} {'MB read':>8} {'floor us':>8} {'us/call':>8} {'floor%':>6} {'GB/s':>8} "
          f"{'slots us':>8} {'err y':>9} {'err H':>9} {'torch us':>9} {'speedup':>8}", file=out)
    ok = True
    for name in args.shapes.split(","):
        for t in (int(v) for v in args.tokens.split(",")):
            ok &= bench_shape(name.strip(), t, device, floor_bw, args.sweep, out)
    ok &= graph_replay_check(device, out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
