"""`strata bench prompt-attn`: the prompt-attention parity tool. Per shape and kernel variant: ms per launch, error
against float64, error against the fp32 kernel, PASS/FAIL by the bounds below, the fraction of the HBM floor; plus
torch SDPA on the same cells dequantized to bf16.

Data (synthetic, as the upstream parity test): int8 codes U[-127, 127] with fp16 scales U[0.005, 0.03], q ~ N(0, 2^2),
a shuffled page table; queries at ctx - Q .. ctx - 1; each selects every cell while they fit in top_k + 3, else the
512 newest plus older cells drifting about 3% per query.
Bounds: `err <= max(4 * err_fp32, 1e-6 * scale)` against float64 (on every (Q/16)-th query, `scale = max|ref|`) and
`max|x - fp32| <= 1e-4 * max|fp32|` over all outputs.
Floor: bytes of K/V codes, scales and cell ids read once per query (plus q and the output) over the measured copy
bandwidth of the same run.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
from dataclasses import dataclass, replace

import numpy as np
import torch

from strata.bench.ceilings import Timer, copy_bandwidth, graph_us

DEFAULT_SHAPES = [(32768, 1024), (65536, 512), (1500, 1500), (2100, 256), (32768, 2048)]
LONG_SHAPES = [(131072, 512), (524288, 256)]  # issue 5's "to 512K tokens": a pool of 0.53 GB at 512K, ids 2 MB
VARIANT_ORDER = ["fp32", "v1", "v2", "v2t", "imma"]
DRIFT = 0.03


def make_pool(ctx: int, n_kv_heads: int, dim: int, device, seed: int):
    from strata.kernels.attention.paged import PagedKV

    g = torch.Generator(device=device).manual_seed(seed)
    n_pages = (ctx + 3) // 4
    pool = PagedKV.empty(n_pages, n_kv_heads, dim, int8=True, device=device)
    for codes, scales in ((pool.k, pool.k_scale), (pool.v, pool.v_scale)):
        codes.copy_(torch.randint(-127, 128, codes.shape, generator=g, device=device))
        scales.copy_(torch.rand(scales.shape, generator=g, device=device) * 0.025 + 0.005)
    table = torch.randperm(n_pages, generator=g, device=device).int()
    return pool, table


def make_selections(ctx: int, n_q: int, cap: int, recent: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [n_q, cap] (ascending, -1 padded) and width [n_q] for queries at ctx - n_q .. ctx - 1."""
    rng = np.random.default_rng(seed)
    ids = np.full((n_q, cap), -1, dtype=np.int32)
    width = np.zeros(n_q, dtype=np.int32)
    member = np.zeros(ctx, dtype=bool)
    older = None
    for i, pos in enumerate(range(ctx - n_q, ctx)):
        n_kv = pos + 1
        if n_kv <= cap:
            ids[i, :n_kv] = np.arange(n_kv)
            width[i] = n_kv
            continue
        n_old, old_end = cap - recent, n_kv - recent  # older cells come from [0, old_end)
        if older is None:
            older = rng.choice(old_end, n_old, replace=False)
        else:
            out = rng.choice(n_old, min(n_old, max(1, round(DRIFT * n_old))), replace=False)
            member[older] = True
            member[older[out]] = False
            free = np.flatnonzero(~member[:old_end])
            free = free[~np.isin(free, older[out])]
            fresh = rng.choice(free, min(len(out), len(free)), replace=False)
            older[out[: len(fresh)]] = fresh
            member[:] = False
        ids[i] = np.sort(np.concatenate([older, np.arange(old_end, n_kv)]))
        width[i] = cap
    return torch.from_numpy(ids), torch.from_numpy(width)


def floor_bytes(width: torch.Tensor, n_kv_heads: int, n_heads: int, dim: int) -> int:
    cells = int(width.long().sum())
    per_cell = n_kv_heads * (2 * dim + 2 * (dim // 64) * 2) + 4  # K and V codes, their fp16 scales, the id
    return cells * per_cell + 2 * width.shape[0] * n_heads * dim * 4  # + q and the output, fp32


def sdpa_inputs(q, pool, table, ids, width, step: int = 256):
    """bf16 q [n_q, KVH, G, D] (a KV head's query heads as its query rows), K/V [n_q, KVH, cap, D] of the selected
    cells (dequantized in fp32), mask [n_q, 1, 1, cap]."""
    from strata.kernels.attention.kv_int8 import gather_kv

    n_q, cap = ids.shape
    valid = torch.arange(cap, device=ids.device)[None] < width[:, None]
    cells = torch.where(valid, ids.long(), 0)
    k = torch.empty(n_q, pool.n_kv_heads, cap, pool.head_dim, dtype=torch.bfloat16, device=q.device)
    v = torch.empty_like(k)
    for q0 in range(0, n_q, step):
        for kvh in range(pool.n_kv_heads):
            kk, vv = gather_kv(pool, table, cells[q0 : q0 + step], kvh, torch.float32)
            k[q0 : q0 + step, kvh], v[q0 : q0 + step, kvh] = kk, vv
    return q.bfloat16().unflatten(1, (pool.n_kv_heads, -1)), k, v, valid[:, None, None]


@dataclass
class ShapeData:
    """One shape's inputs, its float64 reference on the sampled queries and its floor."""

    q: torch.Tensor
    pool: object
    table: torch.Tensor
    ids: torch.Tensor
    width: torch.Tensor
    sample: torch.Tensor
    ref: torch.Tensor
    ref_scale: float
    floor_ms: float

    def inputs(self):
        return self.q, self.pool, self.table, self.ids, self.width

    def errors(self, out: torch.Tensor, fp32: torch.Tensor) -> tuple[float, float]:
        """(max error vs float64 on the sample, max |out - fp32|)."""
        return (out[self.sample].double() - self.ref).abs().max().item(), (out - fp32).abs().max().item()


def shape_data(ctx: int, n_q: int, args, device: torch.device, bandwidth: float) -> ShapeData:
    from strata.kernels.attention.prompt_ref import prompt_attn_ref

    cap = args.top_k + 3
    if device.type == "cuda":  # each shape's own peak (`memory_line`)
        torch.cuda.reset_peak_memory_stats(device)
    pool, table = make_pool(ctx, args.kv_heads, args.dim, device, args.seed)
    ids, width = (t.to(device) for t in make_selections(ctx, n_q, cap, min(args.recent, cap), args.seed))
    g = torch.Generator(device=device).manual_seed(args.seed + 1)
    q = torch.randn(n_q, args.heads, args.dim, generator=g, device=device) * 2
    sample = torch.arange(0, n_q, max(1, n_q // 16), device=device)
    ref = prompt_attn_ref(q[sample], pool, table, ids[sample], width[sample])
    n_bytes = floor_bytes(width, args.kv_heads, args.heads, args.dim)
    data = ShapeData(q, pool, table, ids, width, sample, ref, ref.abs().max().item(), n_bytes / bandwidth * 1e3)
    n_sparse = max(0, min(n_q, ctx - cap))  # queries at pos >= cap see more cells than they select
    print(f"ctx {ctx} x {n_q} queries ({args.heads}/{args.kv_heads} heads x {args.dim}, width <= {cap}, "
          f"{n_sparse} sparse): "
          f"floor {data.floor_ms:.3f} ms ({n_bytes / 1e9:.3f} GB at {bandwidth / 1e12:.2f} TB/s); "
          f"output scale {data.ref_scale:.3f}; pool {pool_bytes(pool) / 1e9:.2f} GB, selections "
          f"{(ids.numel() + width.numel()) * 4 / 1e6:.1f} MB")
    return data


def pool_bytes(pool) -> int:
    return sum(t.numel() * t.element_size() for t in (pool.k, pool.v, pool.k_scale, pool.v_scale) if t is not None)


def memory_line(device: torch.device) -> None:
    """The shape's peak of allocated GPU memory (data, references, SDPA's gathered cells, the kernels' buffers)."""
    if device.type == "cuda":
        print(f"  info peak GPU memory {torch.cuda.max_memory_allocated(device) / 1e9:.2f} GB")


def graph_ms(call, reps: int, device: torch.device) -> float:
    """ms per call replayed from one CUDA graph of `reps` calls: the kernels' time without the launches' host work
    (Python, Triton's launcher, tensor setup), which eager timing counts wherever it outlasts the GPU's; nan off the
    GPU or where the capture fails."""
    if device.type != "cuda":
        return math.nan
    try:
        return graph_us(lambda: call(), [()] * max(1, reps), device) / 1e3
    except Exception as e:  # noqa: BLE001  (information: the eager figure stands)
        print(f"  info graph capture failed: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}")
        return math.nan


def graph_text(ms: float | None, floor_ms: float) -> str:
    """`graph 0.250 ms (52.0% of floor)  ` beside an eager figure, or nothing (no --graph)."""
    return "" if ms is None else f"graph {ms:7.3f} ms ({floor_ms / ms:6.1%} of floor)  "


def within_bounds(err: float, vs_fp32: float, err_fp32: float, ref_scale: float, fp32_scale: float) -> bool:
    """Strata's parity bounds: against float64 no worse than max(4 x the fp32 kernel, 1e-6 of the scale), and
    within 1e-4 of the scale of the fp32 kernel."""
    return err <= max(4 * err_fp32, 1e-6 * ref_scale) and vs_fp32 <= 1e-4 * fp32_scale


def fp32_yardstick(data: ShapeData, out: torch.Tensor | None = None) -> tuple[torch.Tensor, float, float]:
    """The fp32 kernel's output (or, when absent, the torch reference in fp32), its scale and its error vs float64."""
    from strata.kernels.attention.prompt_ref import prompt_attn_ref

    fp32 = out if out is not None else prompt_attn_ref(*data.inputs(), dtype=torch.float32)
    return fp32, fp32.abs().max().item(), data.errors(fp32, fp32)[0]


def run_shape(ctx: int, n_q: int, args, device: torch.device, bandwidth: float) -> bool:
    from strata.kernels.attention.prompt import VARIANTS

    data = shape_data(ctx, n_q, args, device, bandwidth)
    q, pool, table, ids, width = data.inputs()
    sample, ref, ref_scale, floor_ms = data.sample, data.ref, data.ref_scale, data.floor_ms
    timer = Timer(device)
    names = [n for n in VARIANT_ORDER if n in args.variants]
    calls, outs, ok = {}, {}, True
    for n in names:  # compiles, and keeps the outputs compared below; a kernel that fails is a FAIL, not the end
        calls[n] = lambda n=n: VARIANTS[n](q, pool, table, ids, width)
        try:
            outs[n] = calls[n]()
        except Exception as e:  # noqa: BLE001
            print(f"  FAIL {n:<9} {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            del calls[n]
            ok = False
    ms, graphed = {}, {}
    for _ in range(2):  # alternate the variants twice; the second round counts
        for n, call in calls.items():
            ms[n] = timer(call, args.reps)
    for n, call in calls.items() if args.graph and device.type == "cuda" else ():
        graphed[n] = graph_ms(call, args.reps, device)
    fp32, fp32_scale, err_fp32 = fp32_yardstick(data, outs.get("fp32"))  # without the kernel: the torch reference
    for n in calls:
        out = outs[n]
        err, vs_fp32 = data.errors(out, fp32)
        good = within_bounds(err, vs_fp32, err_fp32, ref_scale, fp32_scale)
        ok &= good
        digest = hashlib.sha256(out.cpu().numpy().tobytes()).hexdigest()[:12]
        print(f"  {'PASS' if good else 'FAIL'} {n:<9} {ms[n]:9.3f} ms  {floor_ms / ms[n]:6.1%} of floor  "
              f"{graph_text(graphed.get(n), floor_ms)}"
              f"vs FP64 {err / ref_scale:.2e}  vs fp32 {vs_fp32 / fp32_scale:.2e}  hash {digest}{blocking(n)}")
    if args.sdpa:
        import torch.nn.functional as F

        try:
            sq, sk, sv, mask = sdpa_inputs(q, pool, table, ids, width)
            out = F.scaled_dot_product_attention(sq, sk, sv, attn_mask=mask).flatten(1, 2).float()
            t = timer(lambda: F.scaled_dot_product_attention(sq, sk, sv, attn_mask=mask), args.reps)
            err = (out[sample].double() - ref).abs().max().item()
            vs_fp32 = (out - fp32).abs().max().item()
            print(f"  info sdpa-bf16 {t:9.3f} ms  {floor_ms / t:6.1%} of floor  vs FP64 {err / ref_scale:.2e}  "
                  f"vs fp32 {vs_fp32 / fp32_scale:.2e}  (cells pre-gathered, {2 * sk.numel() * 2 / 1e9:.2f} GB)")
        except Exception as e:  # noqa: BLE001  (information only)
            print(f"  info sdpa-bf16 failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    memory_line(device)
    return ok


def blocking(variant: str) -> str:
    """The tunables a blocked variant runs with (its default, or STRATA_PA_CONFIG's), for the table."""
    from strata.kernels.attention import prompt_imma, prompt_v2
    from strata.kernels.attention.prompt_blocks import PromptConfig

    default = {"v2": prompt_v2.DEFAULT, "v2t": prompt_v2.DEFAULT, "imma": prompt_imma.DEFAULT}.get(variant)
    if default is None:
        return ""
    config = PromptConfig.chosen(None, default)
    return f"  {config.label if variant != 'v2t' else replace(config, stages=1).label}"


def _numbers(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number or a comma-separated list") from None


def _shapes(contexts: list[int], queries: list[int]) -> list[tuple[int, int]]:
    """(ctx, queries) per context: one query count for all, or one each."""
    if len(queries) not in (1, len(contexts)):
        raise SystemExit(f"strata bench prompt-attn: {len(contexts)} contexts but {len(queries)} query counts")
    return list(zip(contexts, queries * len(contexts) if len(queries) == 1 else queries))


def add_data_args(p: argparse.ArgumentParser) -> None:
    """The device and the synthetic pool's and selections' shape (`make_pool`, `make_selections`), shared with
    `bench qsa-attn`, which builds its data the same way."""
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--heads", type=int, default=24)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--top-k", type=int, default=2048, help="selection budget in cells (width = top_k + 3)")
    p.add_argument("--recent", type=int, default=512, help="newest cells in every sparse selection")
    p.add_argument("--seed", type=int, default=0)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="strata bench prompt-attn", description=__doc__.split("\n\n")[0])
    p.add_argument("--ctx", type=_numbers, help="context cells, or a comma-separated list (default: the five "
                   "standard shapes)")
    p.add_argument("--queries", type=_numbers, default=[1024], help="queries with --ctx (one value, or one a ctx)")
    p.add_argument("--long", action="store_true", help="the long contexts 131,072 x 512 and 524,288 x 256 instead "
                   "of the five standard shapes")
    p.add_argument("--reps", type=int, default=5)
    add_data_args(p)
    p.add_argument("--variants", nargs="+", default=VARIANT_ORDER, choices=VARIANT_ORDER)
    p.add_argument("--no-sdpa", dest="sdpa", action="store_false")
    p.add_argument("--graph", action="store_true",
                   help="also time each launch replayed from a CUDA graph (no host work; the sweep then ranks by it)")
    p.add_argument("--sweep", nargs="*", metavar="CONFIG",
                   help="time v2 / v2t / imma over tunable sets such as q5h6c32w4s3 (queries and heads per program, "
                        "chunk, warps, stages; none given: a built-in list) beside each variant's default")
    p.add_argument("--sass", nargs="*", metavar="CONFIG",
                   help="no timing: compile v2 / imma for sm_90 here (no GPU needed) and print each config's "
                        "registers, spills, shared memory and chunk-loop instruction count (none given: --sweep's list)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Print one block per shape; 0 if every variant passes its bounds, else 1."""
    args = parser().parse_args(argv)
    if args.sass is not None:
        from strata.bench.prompt_attn_sass import run_sass

        return run_sass(args, args.sass, sys.argv[1:] if argv is None else argv)
    device = torch.device(args.device)
    bandwidth = copy_bandwidth(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton interpreter)"
    print(f"prompt attention parity on {name}, torch {torch.__version__}")
    shapes = _shapes(args.ctx, args.queries) if args.ctx else LONG_SHAPES if args.long else DEFAULT_SHAPES
    if args.sweep is not None:
        from strata.bench.prompt_attn_sweep import run_sweep

        return run_sweep(args, device, bandwidth, shapes)
    ok = True
    for ctx, n_q in shapes:
        ok &= run_shape(ctx, min(n_q, ctx), args, device, bandwidth)
    print("all PASS" if ok else "some FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
