"""How fast decode misses read pinned host RAM: one MoE layer's top-k GEMVs with K of the k experts in host memory.

For each shape and K = 0..k (one token; K = 0: what the miss path costs a layer whose experts all hit): microseconds
a call, replayed from a CUDA graph over calls whose missed experts are distinct (every replay reads more host bytes
than L2 holds), and GB/s of host bytes (K experts' gate, up and down) with its ratio to the pinned copy rate
measured in the same run (`host_to_device_bandwidth`), for
  inplace  the misses' GEMVs reading host RAM in place (zero-copy, `--misses direct`'s default),
  beside   the same beside the hits' GEMVs (k - K experts in HBM) on a second stream, joined: the layer's expert
           time in decode; `+us` is what the misses add to the hits alone (`hits`),
  gather   copy_misses' gather launch alone (`STRATA_MISSES_COPY`), then `+gemv` with the HBM GEMVs after it,
           `overlap` the same with the down parts crossing beside the gate/up GEMV (the engine's), `beside` that
           beside the hits,
  skip+us  what the in-place misses add beside the hits inside STRATA_MISSES_SKIP's conditional graph node,
  memcpy   one cudaMemcpyAsync a missed part (the host knows the misses here, as a captured step cannot), then
           `memcpy+gemv`.
Checks: the in-place misses against float64 (gemv.ERROR_BOUND), the copied misses' bytes equal to the in-place ones.
`--sweep`: at K = --sweep-misses, each kernel of the in-place misses under `miss_tiles.miss_sweep_configs` and the
gather launch under chunk x warps, every line beside the first (the current default) with its GB/s.

    strata bench miss-bw [--shapes qwen4exp-q2_0,a3b-q4_0] [--misses 1,2,4] [--sweep] [--sweep-misses 2]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

import torch

from strata.kernels import INTERPRETED  # first: it turns the interpreter on without a GPU, before Triton loads
from strata.bench.ceilings import graph_us, host_to_device_bandwidth
from strata.bench.moe_decode import SHAPES as DECODE_SHAPES
from strata.bench.moe_decode import synthetic_stack
from strata.kernels.moe.gemv import (ERROR_BOUND, DecodeExperts, down_sum_triton, gate_up_swiglu_triton, moe_gemv,
                                     moe_gemv_float64, relative_error)
from strata.kernels.moe.miss_copy import CopyConfig, copy_config, copy_misses, scratch_bytes

SHAPES = {**DECODE_SHAPES, "tiny-q4_0": ("Q4_0", "Q4_0", 128, 64, 8, 4)}  # tiny: the CPU test
HOST_EXPERTS = {"qwen4exp-q2_0": 160}  # 160 x 1.32 MiB: 221 MB of host bytes a replay, > 4x an H200's L2
L2_BYTES = 50 << 20
COPY_SWEEP = [CopyConfig(c, w) for c in (1024, 2048, 4096, 8192, 16384) for w in (2, 4, 8) if c % (128 * w) == 0]


class Layer:
    """One layer's experts twice (pinned host, device), the calls of one K: ids [1, k] with the first K missed."""

    def __init__(self, name: str, device: torch.device, n_experts: int | None = None):
        gu, dn, n_embd, n_ff, experts, self.top_k = SHAPES[name]
        self.n_experts = n_experts or HOST_EXPERTS.get(name, experts)
        stack = synthetic_stack(gu, dn, self.n_experts, n_embd, n_ff, seed=5)
        self.cuda = device.type == "cuda"
        pinned = _map_stack(stack, lambda t: t.pin_memory() if self.cuda else t)
        self.stack = _map_stack(stack, lambda t: t.to(device))
        self.host = DecodeExperts.of_stack(pinned)
        self.dev = DecodeExperts.of_stack(self.stack)
        self.device, self.n_embd = device, n_embd
        self.expert_bytes = scratch_bytes(self.host)

    def calls(self, k_missed: int, gen: torch.Generator) -> list[dict]:
        """Calls whose missed experts run through all experts once (distinct across calls where K allows)."""
        n_calls = (max(2, -(-self.n_experts // k_missed)) if k_missed else 16) if self.cuda else 1
        order = torch.randperm(self.n_experts, generator=gen)
        scratch = torch.zeros(self.top_k, self.expert_bytes, dtype=torch.uint8, device=self.device)  # shared: the
        # calls run one after another
        out = []
        for c in range(n_calls):
            missed = order[torch.arange(c * k_missed, (c + 1) * k_missed) % self.n_experts]
            rest = [e for e in torch.randperm(self.n_experts, generator=gen).tolist() if e not in missed.tolist()]
            ids = torch.cat([missed, torch.tensor(rest[: self.top_k - k_missed], dtype=missed.dtype)])
            missing = torch.full((self.n_experts,), -1, dtype=torch.int32)
            missing[missed] = missed.int()
            hits = torch.where(missing >= 0, -1, torch.arange(self.n_experts, dtype=torch.int32))
            at_position = torch.full((self.n_experts,), -1, dtype=torch.int32)
            at_position[missed] = torch.arange(k_missed, dtype=torch.int32)  # memcpy's slots: the misses come first
            out.append(dict(
                x=torch.randn(1, self.n_embd, generator=gen).to(self.device, torch.bfloat16),
                ids=ids[None].int().to(self.device),
                w=torch.softmax(torch.randn(1, self.top_k, generator=gen), dim=-1).to(self.device),
                missed=missed.tolist(), missing=missing.to(self.device), hits=hits.to(self.device),
                scratch=scratch, table=torch.full((self.n_experts,), -1, dtype=torch.int32, device=self.device),
                mtable=at_position.to(self.device)))
        return out


def _map_stack(stack, fn):
    from strata.engine.experts import ExpertStack
    from strata.models.weights import QuantWeight

    return ExpertStack(*(QuantWeight(p.name, p.ggml_type, p.shape, fn(p.raw)) for p in (stack.gate, stack.up,
                                                                                          stack.down)))


def in_place(layer: Layer, c: dict, configs=(None, None)) -> torch.Tensor:
    experts = replace(layer.host, slot_of=c["missing"], sparse=True)  # as direct_misses.miss_gemv reads them
    if configs == (None, None):
        return moe_gemv(c["x"], c["ids"], c["w"], experts, torch.float32)
    h = gate_up_swiglu_triton(c["x"], c["ids"], experts, configs[0])
    return down_sum_triton(h, c["ids"], c["w"], experts, torch.float32, configs[1])


def hits_only(layer: Layer, c: dict) -> torch.Tensor:
    return moe_gemv(c["x"], c["ids"], c["w"], replace(layer.dev, slot_of=c["hits"]), torch.float32)


def beside(layer: Layer, c: dict, misses_fn) -> torch.Tensor:
    """direct_gemv's schedule: the misses on a side stream, the hits on this one, joined."""
    if not layer.cuda:
        return hits_only(layer, c) + misses_fn(layer, c)
    main = torch.cuda.current_stream(layer.device)
    side = layer.side = getattr(layer, "side", None) or torch.cuda.Stream(layer.device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        misses = misses_fn(layer, c)
    hits = hits_only(layer, c)
    main.wait_stream(side)
    return hits + misses


def gather(layer: Layer, c: dict, config: CopyConfig | None = None) -> None:
    copy_misses(c["ids"], c["missing"], layer.host, c["scratch"], c["table"], config)


def gather_gemv(layer: Layer, c: dict, overlap: bool = False) -> torch.Tensor:
    """The engine's copied misses (`direct_misses.copied_misses`); `overlap`: the down parts cross on a second
    stream while the gate/up GEMV runs (the engine's schedule without STRATA_MISSES_SKIP)."""
    from strata.engine.direct_misses import copied_misses

    stream = None
    if overlap and layer.cuda:
        stream = layer.overlap = getattr(layer, "overlap", None) or torch.cuda.Stream(layer.device)
    return copied_misses(c["x"], c["ids"], c["w"], layer.host, layer.stack, c["missing"], c["scratch"], c["table"],
                         stream, torch.float32)


def gather_overlapped(layer: Layer, c: dict) -> torch.Tensor:
    return gather_gemv(layer, c, overlap=True)


def memcpy(layer: Layer, c: dict) -> None:
    """A cudaMemcpyAsync a missed part into slot = its position (`mtable`, set once outside the timing)."""
    ids = c["ids"].reshape(-1).tolist()
    for e in c["missed"]:
        p, at = ids.index(e), 0
        for m in (layer.host.gate, layer.host.up, layer.host.down):
            c["scratch"][p, at: at + m.expert_bytes].copy_(m.raw[e * m.stride: e * m.stride + m.expert_bytes],
                                                            non_blocking=True)
            at += m.expert_bytes


def memcpy_gemv(layer: Layer, c: dict) -> torch.Tensor:
    memcpy(layer, c)
    return moe_gemv(c["x"], c["ids"], c["w"], DecodeExperts.of_slots(c["scratch"], c["mtable"], layer.stack),
                    torch.float32)


def skipping(layer: Layer, calls: list[dict]) -> float:
    """`beside` with the misses inside a conditional graph node taken only when one is missing (STRATA_MISSES_SKIP's
    `only_if_missed`); nan where this CUDA or torch cannot capture one."""
    from strata.engine.direct_misses import only_if_missed

    def fn(lay, c):
        return beside(lay, c, lambda lay2, c2: only_if_missed(c2["ids"], c2["missing"], c2["x"].float(),
                                                              lambda: in_place(lay2, c2)))

    try:
        return run_graph(layer, fn, calls)
    except Exception as e:  # noqa: BLE001  (a line, not the end of the run)
        print(f"  (conditional nodes: {type(e).__name__}: {str(e)[:120]})", flush=True)
        torch.cuda.synchronize(layer.device)
        return float("nan")


def run_graph(layer: Layer, fn, calls: list[dict]) -> float:
    return graph_us(lambda c: fn(layer, c), [(c,) for c in calls], layer.device)


def eager_if_uncapturable(layer: Layer, fn, calls: list[dict]) -> float:
    """graph_us of fn over the calls, or where a pinned copy does not capture (the host allocator's event), the
    calls queued eagerly between two events (then the host's launch time may show: a bound from above)."""
    from strata.bench.ceilings import Timer

    try:
        return graph_us(lambda c: fn(layer, c), [(c,) for c in calls], layer.device)
    except RuntimeError as e:
        print(f"  ({fn.__name__}: not captured ({str(e)[:80]}); timed eagerly)", flush=True)
        torch.cuda.synchronize(layer.device)
        return min(Timer(layer.device)(lambda: [fn(layer, c) for c in calls], 1) for _ in range(3)) * 1e3 / len(calls)


def _rate(n_bytes: float, us: float, pinned: float) -> str:
    return f"{n_bytes / us / 1e3:6.1f} {n_bytes / us / 1e3 / (pinned / 1e9):5.0%}"


def bench_k(layer: Layer, name: str, k_missed: int, gen, pinned: float, out) -> bool:
    calls = layer.calls(k_missed, gen)
    c0 = calls[0]
    n_bytes = k_missed * layer.expert_bytes
    # Checks: the in-place misses against float64 (the hits' weights zeroed), the copied ones byte for byte.
    got = in_place(layer, c0)
    keep = (c0["missing"][c0["ids"].long()] >= 0).float()
    _, y64 = moe_gemv_float64(c0["x"].cpu(), c0["ids"].cpu(), (c0["w"] * keep).cpu(),
                              replace(layer.host, slot_of=None))
    err = relative_error(got, y64)
    # The GPU kernels sum a token's experts in routing order wherever they read them: the same bytes. (The CPU's
    # reference loop adds experts in the order of their indices, which differ: there within the bound.)
    same = True
    for copied in (gather_gemv(layer, c0), gather_overlapped(layer, c0)):
        same &= torch.equal(copied, got) if layer.cuda else relative_error(copied, got) <= ERROR_BOUND
    ok = err <= ERROR_BOUND and same
    run = lambda fn: graph_us(lambda c: fn(layer, c), [(c,) for c in calls], layer.device)  # noqa: E731
    t = dict(inplace=run(in_place), hits=run(hits_only), beside=run(lambda lay, c: beside(lay, c, in_place)),
             gather=run(gather), gather_gemv=run(gather_gemv), overlapped=run(gather_overlapped),
             beside_copy=run(lambda lay, c: beside(lay, c, gather_overlapped)))
    t["memcpy"], t["memcpy_gemv"] = eager_if_uncapturable(layer, memcpy, calls), eager_if_uncapturable(
        layer, memcpy_gemv, calls)
    t["skip"] = skipping(layer, calls)  # last: a capture that fails may leave the stream unusable
    hits = t["hits"]
    print(f"{name:<14} {k_missed:>2} {n_bytes / 1e6:7.2f} | {t['inplace']:8.2f} {_rate(n_bytes, t['inplace'], pinned)}"
          f" | {hits:7.2f} {t['beside']:8.2f} {t['beside'] - hits:+7.2f} | {t['gather']:8.2f} "
          f"{_rate(n_bytes, t['gather'], pinned)} {t['gather_gemv']:8.2f} {t['overlapped']:8.2f} "
          f"{t['beside_copy']:8.2f} {t['beside_copy'] - hits:+7.2f} | {t['skip'] - hits:+7.2f} | {t['memcpy']:8.2f} "
          f"{_rate(n_bytes, t['memcpy'], pinned)} {t['memcpy_gemv']:8.2f} | {err:8.1e} "
          f"{'same' if same else 'DIFF'}{'' if ok else '  FAIL'}", file=out, flush=True)
    return ok


def sweep(layer: Layer, name: str, k_missed: int, gen, pinned: float, out) -> bool:
    """At K misses: the gather under COPY_SWEEP (first: its kernel builds fast), then each in-place kernel under
    miss_sweep_configs, every line beside the first (the current default), with its error against float64."""
    calls = layer.calls(k_missed, gen)
    args = [(c,) for c in calls]
    n_bytes = k_missed * layer.expert_bytes
    ok, first_us, want = True, None, None
    for cfg in [copy_config()] + [c for c in COPY_SWEEP if c != copy_config()]:
        us = graph_us(lambda c, cfg=cfg: gather(layer, c, cfg), args, layer.device)
        gather(layer, calls[0], cfg)
        got = calls[0]["scratch"].clone()
        want = got if want is None else want
        ok &= torch.equal(got, want)
        first_us = first_us or us
        print(f"  sweep {name:<14} gather   chunk={cfg.chunk:<6} warps={cfg.warps:<2} {us:8.2f} us "
              f"{_rate(n_bytes, us, pinned)} of pinned {first_us / us:5.2f}x default  "
              f"{'same bytes' if torch.equal(got, want) else 'DIFF  FAIL'}  CopyConfig({cfg.chunk}, {cfg.warps})",
              file=out, flush=True)
    return ok & _sweep_in_place(layer, name, k_missed, calls, pinned, out)


def _sweep_in_place(layer: Layer, name: str, k_missed: int, calls: list[dict], pinned: float, out) -> bool:
    from strata.bench.gemv_sweep import describe
    from strata.kernels.moe.miss_tiles import miss_sweep_configs, tile_entry

    c0, args = calls[0], [(c,) for c in calls]
    keep = (c0["missing"][c0["ids"].long()] >= 0).float()
    h64, y64 = moe_gemv_float64(c0["x"].cpu(), c0["ids"].cpu(), (c0["w"] * keep).cpu(),
                                replace(layer.host, slot_of=None))
    want = {"gate_up": h64 * keep.cpu()[:, :, None].double(), "down": y64}
    experts = lambda c: replace(layer.host, slot_of=c["missing"], sparse=True)  # noqa: E731
    h = {id(c): gate_up_swiglu_triton(c["x"], c["ids"], experts(c)) for c in calls}
    g, d = layer.host.gate, layer.host.down
    ok = True
    for kind, m in (("gate_up", g), ("down", d)):
        n_bytes = k_missed * (2 * g.expert_bytes if kind == "gate_up" else d.expert_bytes)
        first_us = first_out = None
        for cfg in miss_sweep_configs(kind, m.spec, m.rows, m.cols, layer.top_k):
            if kind == "gate_up":
                fn = lambda c, cfg=cfg: gate_up_swiglu_triton(c["x"], c["ids"], experts(c), cfg)  # noqa: E731
            else:
                fn = lambda c, cfg=cfg: down_sum_triton(h[id(c)], c["ids"], c["w"], experts(c),  # noqa: E731
                                                        torch.float32, cfg)
            try:
                got = fn(c0)
                us = graph_us(fn, args, layer.device)
            except Exception as e:  # a tile that does not build is a line, not the end of the sweep
                print(f"  sweep {name} {kind} {describe(cfg)}: {type(e).__name__}: {str(e)[:160]}", file=out)
                continue
            err = relative_error(got, want[kind])
            ok &= err <= ERROR_BOUND
            first_us, first_out = first_us or us, first_out if first_out is not None else got.clone()
            same = "same bytes" if torch.equal(got, first_out) else "other bytes"
            print(f"  sweep {name:<14} {kind:<8} {describe(cfg):<44} {us:8.2f} us {_rate(n_bytes, us, pinned)} of "
                  f"pinned {first_us / us:5.2f}x default  {err:8.1e}{'' if err <= ERROR_BOUND else ' FAIL'}  {same}  "
                  f"{tile_entry(cfg)}", file=out, flush=True)
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="strata bench miss-bw", description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="qwen4exp-q2_0,a3b-q4_0", help=f"comma-separated, of: {', '.join(SHAPES)}")
    p.add_argument("--misses", default="", help="comma-separated K values (default: 0..k; none: the sweep only; "
                   "0: what the miss path costs a layer that misses nothing)")
    p.add_argument("--sweep", action="store_true", help="tiles of the in-place misses and the gather at one K")
    p.add_argument("--sweep-misses", type=int, default=2, help="K of the sweep (default 2)")
    p.add_argument("--experts", type=int, default=0, help="experts in the layer (default: the shape's, or enough "
                   "to outgrow L2)")
    p.add_argument("--device", default="cuda", help="cuda, or cpu (the tests: the same code, times meaningless)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("miss-bw: needs a CUDA GPU (or --device cpu for a dry run)")
        return 2
    if device.type == "cpu" and not INTERPRETED:  # Triton compiled for the GPU cannot launch on CPU tensors
        print("miss-bw: --device cpu runs the kernels under Triton's interpreter: set TRITON_INTERPRET=1 "
              "(or use --device cuda)")
        return 2
    out = sys.stdout
    pinned = host_to_device_bandwidth(device) if device.type == "cuda" else 1e9
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{name}; pinned host->device copy {pinned / 1e9:.1f} GB/s; host bytes = K experts' gate+up+down; "
          f"GB/s then % of the pinned copy rate; error of the in-place misses vs float64 (bound {ERROR_BOUND:g})",
          file=out)
    print(f"{'shape':<14} {'K':>2} {'MB host':>7} | {'inplace':>8} {'GB/s':>6} {'%pin':>5} | {'hits':>7} "
          f"{'beside':>8} {'+us':>7} | {'gather':>8} {'GB/s':>6} {'%pin':>5} {'+gemv':>8} {'overlap':>8} {'beside':>8} "
          f"{'+us':>7} | {'skip+us':>7} | {'memcpy':>8} {'GB/s':>6} {'%pin':>5} {'+gemv':>8} | {'err':>8}", file=out)
    ok = True
    gen = torch.Generator().manual_seed(6)
    for shape in (s.strip() for s in args.shapes.split(",")):
        layer = Layer(shape, device, args.experts or None)
        if layer.cuda and layer.n_experts * layer.expert_bytes < 2 * L2_BYTES:
            print(f"  ({shape}: {layer.n_experts} experts may stay in L2 between replays)", file=out)
        ks = ([] if args.misses == "none" else [int(v) for v in args.misses.split(",")] if args.misses
              else range(layer.top_k + 1))
        for k_missed in dict.fromkeys(min(k, layer.top_k) for k in ks):
            ok &= bench_k(layer, shape, k_missed, gen, pinned, out)
        if args.sweep:
            ok &= sweep(layer, shape, min(args.sweep_misses, layer.top_k), gen, pinned, out)
        del layer
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
