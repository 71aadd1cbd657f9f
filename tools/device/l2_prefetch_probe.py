"""On the GPU: does a Hopper bulk L2 prefetch (`cp.async.bulk.prefetch.L2.global`, one instruction a range, no
registers or shared memory) hide the latency of a chain of small dependent reading kernels, the shape of a decode
step (issue 4: each of A3B's eight kernels a layer runs one short wave at 16-27 % of DRAM)?

A chain of N reader kernels, each reading its own buffer of S MB in one burst a program (like the one-shot GEMVs)
and storing a sum a program; the kernels follow each other in one stream (each waits for the previous one, as the
step's kernels wait for their activations). Captured in a CUDA graph after a kernel that evicts L2. Variants:
  none        no prefetch;
  next D      each reader's programs first prefetch their share of the buffer D kernels ahead;
  all         one kernel at the chain's start prefetches every buffer (while the total fits L2).
Prints the chain's time, its bytes / that time against the measured copy rate, and a float64 check of the sums.

Usage: python3 tools/device/l2_prefetch_probe.py [--mb 4.7,14] [--chain 8] [--programs 256]
"""

import argparse

import torch
import triton
import triton.language as tl


@triton.jit
def _l2_prefetch(ptr, n_bytes):
    """Ask the L2 for n_bytes (a multiple of 16, 16-byte aligned) from ptr; nothing waits for it."""
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n mov.u32 $0, 0;", "=r,l,r",
                              [ptr, n_bytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _reader(w, out, pf, PF_BYTES: tl.constexpr, WORDS: tl.constexpr, BLOCK: tl.constexpr, PF: tl.constexpr):
    pid = tl.program_id(0)
    if PF:
        lane = tl.arange(0, 1)
        _l2_prefetch(pf.to(tl.pointer_type(tl.int8)) + pid.to(tl.int64) * PF_BYTES + lane, PF_BYTES + 0 * lane)
    offs = tl.arange(0, BLOCK)
    x = tl.load(w + pid.to(tl.int64) * WORDS + offs, mask=offs < WORDS, other=0)
    tl.store(out + pid, tl.sum(x.to(tl.float32), axis=0))


@triton.jit
def _prefetch_all(ptrs, sizes, N: tl.constexpr, CHUNK: tl.constexpr):
    pid = tl.program_id(0)  # buffer
    base = tl.load(ptrs + pid).to(tl.pointer_type(tl.int8))
    size = tl.load(sizes + pid)
    lane = tl.arange(0, 256)
    at = lane.to(tl.int64) * CHUNK
    n = tl.minimum(size - at, CHUNK)
    ok = n > 0
    _l2_prefetch(base + tl.where(ok, at, 0), tl.where(ok, n, 16).to(tl.int32))


def run(mb: float, chain: int, programs: int, variant: str, distance: int, reps: int = 20):
    dev = torch.device("cuda")
    words = int(mb * 1e6 / 4 / programs) // 4 * 4  # int32 words a program (16-byte aligned shares)
    block = triton.next_power_of_2(words)
    bufs = [torch.randint(-100, 100, (programs * words,), dtype=torch.int32, device=dev) for _ in range(chain)]
    outs = [torch.empty(programs, dtype=torch.float32, device=dev) for _ in range(chain)]
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=dev)
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64, device=dev)
    sizes = torch.tensor([b.numel() * 4 for b in bufs], dtype=torch.int64, device=dev)
    share = words * 4

    def chain_body():
        if variant == "all":
            _prefetch_all[(chain,)](ptrs, sizes, chain, triton.cdiv(share * programs, 256) // 16 * 16 + 16,
                                    num_warps=8)
        for i in range(chain):
            ahead = i + distance
            pf = bufs[ahead] if variant == "next" and ahead < chain else bufs[i]
            _reader[(programs,)](bufs[i], outs[i], pf, share, words, block,
                                 variant == "next" and ahead < chain, num_warps=4)

    def body(with_chain: bool):
        flush.fill_(1)  # evicts L2
        if with_chain:
            chain_body()

    graphs = {}
    for with_chain in (False, True):
        body(with_chain)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            body(with_chain)
        graphs[with_chain] = g
    times = {with_chain: replay_ms(g, reps) for with_chain, g in graphs.items()}
    for i in range(chain):
        want = bufs[i].view(programs, words).double().sum(1)
        err = (outs[i].double() - want).abs().max().item() / max(want.abs().max().item(), 1.0)
        assert err < 1e-6, f"buffer {i}: sums off by {err:.2e} of the largest"
    return (times[True] - times[False]) * 1e3  # us


def replay_ms(graph, reps: int) -> float:
    """The median milliseconds of `reps` replays of a captured CUDA graph (after one warm replay)."""
    graph.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(reps):
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b))
    return sorted(samples)[reps // 2]


def copy_rate() -> float:
    a = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        b.copy_(a)
    e.record()
    e.synchronize()
    return 2 * 10 * a.numel() / (s.elapsed_time(e) * 1e-3)  # read + write bytes a second


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mb", default="4.7,14")
    p.add_argument("--chain", type=int, default=8)
    p.add_argument("--programs", type=int, default=256)
    args = p.parse_args()
    rate = copy_rate()
    print(f"device copy rate {rate / 1e12:.2f} TB/s (read + write)")
    for mb in (float(m) for m in args.mb.split(",")):
        total = mb * 1e6 * args.chain
        floor_us = total / rate * 1e6
        print(f"\nchain of {args.chain} readers x {mb} MB ({args.programs} programs each): floor {floor_us:.1f} us")
        for variant, distance in (("none", 0), ("next", 1), ("next", 2), ("next", 3), ("all", 0)):
            if variant == "all" and total > 40e6:
                continue
            us = run(mb, args.chain, args.programs, variant, distance)
            name = f"{variant} {distance}" if variant == "next" else variant
            print(f"  {name:8s} {us:8.1f} us = {us / args.chain:6.2f} us a kernel, {floor_us / us:6.1%} of the "
                  f"copy rate; sums within 1e-6 of float64")


if __name__ == "__main__":
    main()
