"""Issue 4's open question on the GPU: what share of the HBM bound can an all-resident A3B decode step reach as a
chain of kernels (a kernel a stage, in a CUDA graph, with or without PDL), and as ONE persistent kernel whose
stages are separated by grid-wide barriers?

The probe reads the bytes of A3B's decode stages (Q4_0 at 18 bytes a 32 weights; a layer: q/k/v 5.90 MB,
attention's int8 KV over 256 positions 0.26 MB, o 4.72 MB, router 0.52 MB, the 8 experts' gate/up 14.16 MB and
down 7.08 MB; 48 layers, each stage's bytes its own buffer so nothing is served from L2) and sums them, in four
forms (`--forms`; session 14's figures in docs/BENCHMARKS.md), timed over CUDA-graph replays:
  launches    one kernel a stage (grid = the stage's blocks), the 288 launches captured in a graph; also with
              programmatic dependent launch (its loads before the wait for the previous kernel, as STRATA_PDL=1),
              and so but for the experts' gate/up, whose loads wait (the routing names its weights); and that
              last chain reading the bytes as GGUF's Q4_0 blocks lie (18 bytes: 2-byte loads), with and without
              the Q4_0 matvec's arithmetic (every stage's bytes as rows of 2,048 weights; checked by --check);
  stream      one persistent kernel (one or two programs an SM) reading stage after stage without waiting: what
              the read code itself reaches;
  barrier     the same with a grid-wide barrier after each stage (an atomic arrival, then a spin on the counter);
  ahead       as barrier, with each program's first block of the next stage loaded before it spins.
And the barrier alone (stages of no bytes): microseconds a barrier.

Prints each form's time a layer, GB/s, % of the read rate a device copy measures (reads alone run at the copy's
whole rate, BENCHMARKS' convention), and what the form implies for a token (48 layers + the 0.37 GB of head and
embeddings at the copy rate) against issue 4's 60 % of the HBM bound. No engine code: a feasibility figure for
the planners (a real kernel also computes, and its stages' programs need the previous stage's outputs).

    python3 tools/device/megakernel_probe.py [--blocks 2048,4096] [--warps 4,8] [--per-sm 1,2]
        [--forms launches,pdl,q4,q4dot,stream,barrier,ahead,alone] [--check]
"""

import argparse
import math
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from strata.bench.ceilings import graph_us, read_bandwidth  # noqa: E402
from strata.kernels.pdl import pdl_start, pdl_wait  # noqa: E402

Q4_0 = 18 / 32  # bytes a weight
HIDDEN, Q_ROWS, KV_ROWS, FF, TOP_K, EXPERTS = 2048, 4096, 512, 768, 8, 128
LAYER_BYTES = {  # one A3B decode layer's reads, in stage order
    "qkv": (Q_ROWS + 2 * KV_ROWS) * HIDDEN * Q4_0,
    "attention": 4 * 128 * 256 * 2,  # int8 K and V of 4 KV heads over 256 positions
    "o": HIDDEN * Q_ROWS * Q4_0,
    "router": EXPERTS * HIDDEN * 2,
    "gate_up": TOP_K * 2 * FF * HIDDEN * Q4_0,
    "down": TOP_K * HIDDEN * FF * Q4_0,
}
LAYERS = 48
HEAD_BYTES = 0.37e9  # the output head and the embedding row (A3B Q4_0's ~1.94 GB a token less its 48 layers)


@triton.jit
def _read(buf, lo, hi, acc, skip, BLOCK: tl.constexpr):
    """acc + the int32 words [lo + skip * BLOCK, hi) of buf, two BLOCKs a step (both loads in flight at once;
    skip: the first block was loaded already)."""
    for i in range(lo + skip * BLOCK, hi, 2 * BLOCK):
        idx = i + tl.arange(0, BLOCK)
        first = tl.load(buf + idx, mask=idx < hi, other=0)
        second = tl.load(buf + idx + BLOCK, mask=idx + BLOCK < hi, other=0)
        acc += first + second
    return acc


@triton.jit
def _share(starts, sizes, s, pid, G: tl.constexpr):
    """Program pid's contiguous share [lo, hi) of stage s's words."""
    n = tl.load(sizes + s)
    lo = tl.load(starts + s) + pid * tl.cdiv(n, G)
    return lo, tl.minimum(lo + tl.cdiv(n, G), tl.load(starts + s) + n)


@triton.jit
def _stages_kernel(buf, starts, sizes, counter, out, n_stages, G: tl.constexpr, BLOCK: tl.constexpr,
                   BARRIER: tl.constexpr, AHEAD: tl.constexpr):
    """G programs read stage after stage, each its contiguous share; BARRIER: all G arrive before any goes on;
    AHEAD: a program's first block of the next stage is loaded before it waits at the barrier."""
    pid = tl.program_id(0)
    lo, hi = _share(starts, sizes, 0, pid, G)
    acc = _read(buf, lo, hi, tl.zeros([BLOCK], tl.int32), 0, BLOCK)
    for s in range(1, n_stages):
        lo, hi = _share(starts, sizes, s, pid, G)
        ahead = tl.zeros([BLOCK], tl.int32)
        if AHEAD:
            idx = lo + tl.arange(0, BLOCK)
            ahead = tl.load(buf + idx, mask=idx < hi, other=0)
        if BARRIER:
            tl.atomic_add(counter, 1)
            while tl.load(counter, volatile=True) < s * G:
                pass
        acc = _read(buf, lo, hi, acc + ahead, 1 if AHEAD else 0, BLOCK)
    tl.store(out + pid * BLOCK + tl.arange(0, BLOCK), acc)


@triton.jit
def _one_stage_kernel(buf, n, out, BLOCK: tl.constexpr, PDL: tl.constexpr = 0, LATE: tl.constexpr = False):
    """A kernel a stage: program p reads block p. PDL (launched with programmatic dependent launch, as the decode
    step's kernels under STRATA_PDL=1): the next stage's kernel may launch at once; the loads (weights) go before
    the wait for the previous kernel, the store after it; LATE: the loads after the wait (the experts' gate/up,
    whose weights the routing names)."""
    pdl_start(PDL)
    if LATE:
        pdl_wait(PDL)
    pid = tl.program_id(0)
    idx = pid * BLOCK + tl.arange(0, BLOCK)
    total = tl.sum(tl.load(buf + idx, mask=idx < n, other=0))  # a sum, so the loads are kept
    if not LATE:
        pdl_wait(PDL)
    tl.store(out + pid, total)


@triton.jit
def _one_stage_blocks_kernel(buf16, n_blocks, out, BB: tl.constexpr, LATE: tl.constexpr):
    """The same under PDL, read as a Q4_0 tensor lies in a GGUF file: 18-byte blocks (an fp16 scale, 16 bytes of
    codes at a 2-byte alignment), BB blocks a program, as 2-byte loads (what an 18-byte stride allows)."""
    pdl_start(1)
    if LATE:
        pdl_wait(1)
    b = tl.program_id(0) * BB + tl.arange(0, BB)
    bm = b < n_blocks
    codes = tl.load(buf16 + b[:, None] * 9 + 1 + tl.arange(0, 8)[None, :], mask=bm[:, None], other=0)
    scale = tl.load(buf16 + b * 9, mask=bm, other=0)
    total = tl.sum(tl.sum(codes.to(tl.int32), axis=1) + scale.to(tl.int32))
    if not LATE:
        pdl_wait(1)
    tl.store(out + tl.program_id(0), total)


@triton.jit
def _one_stage_q4_0_matvec_kernel(w16, x, n_blocks, y, BB: tl.constexpr, K_BLOCKS: tl.constexpr,
                                  LATE: tl.constexpr):
    """The Q4_0 chain's arithmetic too: y = W x for rows of K_BLOCKS 32-weight blocks as GGUF lays them (per block
    an fp16 d, then 16 code bytes: weight j = (byte j & 15) - 8, weight j + 16 = (byte j >> 4) - 8; read as eight
    2-byte words), BB blocks (BB / K_BLOCKS rows) a program; x (fp32, what the previous kernel wrote) after the
    wait, from L2."""
    pdl_start(1)
    if LATE:
        pdl_wait(1)
    b = tl.program_id(0) * BB + tl.arange(0, BB)
    bm = b < n_blocks
    words = tl.load(w16 + b[:, None] * 9 + 1 + tl.arange(0, 8)[None, :], mask=bm[:, None], other=0).to(tl.int32)
    d = tl.load(w16 + b * 9, mask=bm, other=0).to(tl.float16, bitcast=True).to(tl.float32)
    if not LATE:
        pdl_wait(1)
    k = (b % K_BLOCKS)[:, None] * 32 + 2 * tl.arange(0, 8)[None, :]  # word i: weights 2i, 2i + 1, 2i + 16, 2i + 17
    part = ((words & 15) - 8).to(tl.float32) * tl.load(x + k)
    part += (((words >> 8) & 15) - 8).to(tl.float32) * tl.load(x + k + 1)
    part += (((words >> 4) & 15) - 8).to(tl.float32) * tl.load(x + k + 16)
    part += (((words >> 12) & 15) - 8).to(tl.float32) * tl.load(x + k + 17)
    per_block = tl.sum(part, axis=1) * d
    rows = tl.sum(tl.reshape(per_block, (BB // K_BLOCKS, K_BLOCKS)), axis=1)
    r = tl.program_id(0) * (BB // K_BLOCKS) + tl.arange(0, BB // K_BLOCKS)
    tl.store(y + r, rows, mask=r < n_blocks // K_BLOCKS)


def q4_0_matvec_reference(w: torch.Tensor, x: torch.Tensor, k_blocks: int) -> torch.Tensor:
    """float64 y = W x of the GGUF Q4_0 bytes w (uint8, rows of k_blocks blocks) and x."""
    blocks = w.view(-1, 18)
    d = blocks[:, :2].contiguous().view(torch.float16).double()
    q = blocks[:, 2:].long()
    weights = torch.cat([(q & 15) - 8, (q >> 4) - 8], dim=1).double() * d
    return (weights.view(-1, k_blocks * 32) @ x.double().view(-1))


def timed(fn) -> float:
    """Seconds a replay of fn captured in a CUDA graph takes (`ceilings.graph_us`: the best of three means of five
    replays; session 14's and 15's figures took the median of 20 single replays)."""
    return graph_us(fn, [()], "cuda") * 1e-6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20, help="ignored (the recorded batch scripts pass it); see timed()")
    ap.add_argument("--blocks", default="2048,4096")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--per-sm", default="1,2")
    ap.add_argument("--forms", default="launches,pdl,q4,q4dot,stream,barrier,ahead,alone")
    ap.add_argument("--check", action="store_true", help="small stages: each form's sum against torch's, then exit")
    args = ap.parse_args()
    forms = args.forms.split(",")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rate = read_bandwidth(torch.device("cuda"))
    words = [int(LAYER_BYTES[k] // 4) for k in LAYER_BYTES] * LAYERS
    if args.check:
        return check(sms, forms)
    sizes = torch.tensor(words, dtype=torch.int64, device="cuda")
    starts = torch.cumsum(sizes, 0) - sizes
    buf = torch.randint(-1000, 1000, (int(sizes.sum()),), dtype=torch.int32, device="cuda")
    layer_bytes = sum(words[:len(LAYER_BYTES)]) * 4
    total = layer_bytes * LAYERS
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    out = torch.zeros(2 * sms * 16384, dtype=torch.int32, device="cuda")
    x = torch.randn(2048, device="cuda")
    y = torch.empty(max(words) * 4 // 18 // 64 + 1, device="cuda")
    bound_token = (total + HEAD_BYTES) / rate
    print(f"{torch.cuda.get_device_name()}; {sms} SMs; device reads {rate / 1e9:.0f} GB/s; A3B layer "
          f"{layer_bytes / 1e6:.2f} MB in {len(LAYER_BYTES)} stages ({layer_bytes / rate * 1e6:.2f} us at that "
          f"rate), {LAYERS} layers + head: HBM bound {bound_token * 1e3:.3f} ms a token, 60 % of it "
          f"{bound_token / 0.6 * 1e3:.3f} ms")

    def report(name: str, seconds: float, n_barriers: int = 0) -> None:
        per_layer = seconds / LAYERS
        token = seconds + HEAD_BYTES / rate
        print(f"  {name:<34} {per_layer * 1e6:7.2f} us a layer  {total / seconds / 1e9:6.0f} GB/s "
              f"{100 * total / seconds / rate:5.1f} % of the copy's rate; a token {token * 1e3:.3f} ms = "
              f"{100 * bound_token / token:5.1f} % of the HBM bound"
              + (f"; {seconds / n_barriers * 1e6:.2f} us a stage" if n_barriers else ""))

    n_stages = len(words)

    def co_resident(g: int, block: int, warps: int, ahead: bool) -> bool:
        """Whether g programs of this build fit on the GPU at once (registers; no shared memory is used)."""
        k = _stages_kernel.warmup(buf, starts, sizes, counter, out, n_stages, G=g, BLOCK=block, BARRIER=True,
                                  AHEAD=ahead, num_warps=warps, grid=(1,))
        k._init_handles()  # loads the module: n_regs and n_spills are read from it
        per_sm = 65536 // max(1, k.n_regs * 32 * warps)
        return k.n_spills == 0 and g <= sms * min(per_sm, 2048 // (32 * warps))
    for block in [int(b) for b in args.blocks.split(",")]:
        for warps in [int(w) for w in args.warps.split(",")]:
            print(f"BLOCK {block} int32 words ({block * 4 // 1024} KiB) a step, {warps} warps")

            views = [buf[a:a + n] for a, n in zip(starts.tolist(), words)]

            def launches():
                for view in views:
                    _one_stage_kernel[(triton.cdiv(view.numel(), block),)](view, view.numel(), out, BLOCK=block,
                                                                            num_warps=warps)
            if "launches" in forms:
                report("launches (a kernel a stage)", timed(launches))

            late = [name == "gate_up" for name in LAYER_BYTES] * LAYERS

            def launches_pdl(routed: bool):
                for view, after in zip(views, late):
                    _one_stage_kernel[(triton.cdiv(view.numel(), block),)](
                        view, view.numel(), out, BLOCK=block, PDL=1, LATE=routed and after, launch_pdl=True,
                        num_warps=warps)
            if "pdl" in forms:
                report("launches with PDL (mode 1)", timed(lambda: launches_pdl(False)))
                report("the same, gate/up loads after its wait", timed(lambda: launches_pdl(True)))
            bb = 1 << round(math.log2(block * 4 / 18))  # Q4_0 blocks in about BLOCK words, a power of two
            halves = [v.view(torch.int16) for v in views]

            def launches_q4_0():
                for view, after in zip(halves, late):
                    n = view.numel() // 9
                    _one_stage_blocks_kernel[(triton.cdiv(n, bb),)](view, n, out, BB=bb, LATE=after, launch_pdl=True,
                                                                    num_warps=warps)
            if "q4" in forms:
                report(f"as Q4_0 blocks, 2-byte loads, {bb} a program", timed(launches_q4_0))

            def launches_matvec():
                for view, after in zip(halves, late):
                    n = view.numel() // 9 // 64 * 64  # whole rows of 64 blocks (2,048 weights)
                    _one_stage_q4_0_matvec_kernel[(triton.cdiv(n, bb),)](view, x, n, y, BB=bb, K_BLOCKS=64,
                                                                         LATE=after, launch_pdl=True, num_warps=warps)
            if "q4dot" in forms and bb >= 64:
                report(f"Q4_0 matvecs (rows of 2,048), {bb} blocks a program", timed(launches_matvec))
            for per_sm in [int(p) for p in args.per_sm.split(",")]:
                g = sms * per_sm
                for form, barrier, ahead in (("stream", False, False), ("barrier", True, False),
                                             ("ahead", True, True)):
                    if form not in forms:
                        continue
                    if barrier and not co_resident(g, block, warps, ahead):
                        print(f"  {form}, {per_sm} program(s) an SM: skipped (its programs would not all fit at "
                              "once: the barrier would never open)")
                        continue

                    def persistent():
                        counter.zero_()
                        _stages_kernel[(g,)](buf, starts, sizes, counter, out, n_stages, G=g, BLOCK=block,
                                             BARRIER=barrier, AHEAD=ahead, num_warps=warps)
                    report(f"{form}, {per_sm} program(s) an SM", timed(persistent),
                           n_stages if barrier else 0)
    # The barrier alone: stages of no bytes.
    empty = torch.zeros(n_stages, dtype=torch.int64, device="cuda")
    for per_sm in [int(p) for p in args.per_sm.split(",")] if "alone" in forms else []:
        g = sms * per_sm
        if not co_resident(g, 1024, 4, False):
            continue

        def barriers():
            counter.zero_()
            _stages_kernel[(g,)](buf, empty, empty, counter, out, n_stages, G=g, BLOCK=1024, BARRIER=True,
                                 AHEAD=False, num_warps=4)
        t = timed(barriers)
        print(f"  barrier alone, {g} programs: {t / n_stages * 1e6:.2f} us a barrier ({n_stages} in {t * 1e6:.0f} us)")


def check_matvec(device: str) -> float:
    """The Q4_0 matvec kernel against float64 on random blocks (finite scales): its largest error relative to the
    largest output."""
    rows, k_blocks = 96, 64
    w = torch.randint(0, 256, (rows * k_blocks, 18), dtype=torch.uint8)
    w[:, :2] = torch.rand(rows * k_blocks, dtype=torch.float16).view(torch.uint8).view(-1, 2)
    x = torch.randn(k_blocks * 32)
    want = q4_0_matvec_reference(w.view(-1), x, k_blocks)
    got = torch.empty(rows, device=device)
    _one_stage_q4_0_matvec_kernel[(triton.cdiv(rows * k_blocks, 2048),)](
        w.view(-1).view(torch.int16).to(device), x.to(device), rows * k_blocks, got, BB=2048, K_BLOCKS=64, LATE=False)
    return float((got.cpu().double() - want).abs().max() / want.abs().max())


def check(sms: int, forms: list[str]) -> None:
    """Each persistent form's sum over small stages against torch's (a wrong share or a barrier that never opens
    shows here, in seconds, before the timed runs), and the Q4_0 matvec against float64."""
    err = check_matvec("cuda")
    print(f"check Q4_0 matvec: largest error {err:.2e} of the largest output: {'OK' if err < 1e-5 else 'WRONG'}")
    words = [1000, 37, 5000, 300, 70000, 123457] * 3
    sizes = torch.tensor(words, dtype=torch.int64, device="cuda")
    starts = torch.cumsum(sizes, 0) - sizes
    buf = torch.randint(-1000, 1000, (int(sizes.sum()),), dtype=torch.int32, device="cuda")
    for form, barrier, ahead in (("stream", False, False), ("barrier", True, False), ("ahead", True, True)):
        if form not in forms:
            continue
        for g in (sms, 2 * sms):
            out = torch.zeros(g * 2048, dtype=torch.int32, device="cuda")
            counter = torch.zeros(1, dtype=torch.int32, device="cuda")
            _stages_kernel[(g,)](buf, starts, sizes, counter, out, len(words), G=g, BLOCK=2048, BARRIER=barrier,
                                 AHEAD=ahead, num_warps=4)
            torch.cuda.synchronize()
            got, want = int(out.long().sum()), int(buf.long().sum())
            print(f"check {form}, {g} programs: sum {got} against {want}: {'OK' if got == want else 'WRONG'}"
                  + (f"; counter {int(counter)} (expected {(len(words) - 1) * g})" if barrier else ""), flush=True)


if __name__ == "__main__":
    main()
