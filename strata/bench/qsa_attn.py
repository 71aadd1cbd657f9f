"""`strata bench qsa-attn`: a prompt chunk's selected attention over the dense fp16 KV cache, the old path (SDPA with
a dense [tokens, keys] mask, `STRATA_QSA_DENSE_MASK=1`) against the selected-cells kernel (prompt_dense.py), per
context, each beside the floor.

Data: an fp16 cache of `ctx` cells (K ~ N(0, 1), V ~ N(0, 1)), bf16 queries ~ N(0, 2^2) at ctx - T .. ctx - 1 (T the
engine's chunk, 2,419 tokens for the full-size qwen4exp at 12 GiB), the chunk's own keys stored first; selections as
`bench prompt-attn`'s (every cell while they fit in top_k + 3, else the `recent` newest plus older cells drifting
about 3% a query). Both paths are timed through `KVCache.attend`, the engine's call (the old one converts the past
to bf16 and concatenates, as it always did); the sweep times the kernel's launch alone.
Bound: the kernel's fp32 output's error against float64 (on every (T/16)-th query, over the output scale) at most
max(4 x the float32 torch reference's, 2e-6: prompt_dense.ERROR_FLOOR); the old path's error is printed beside it
(its past keys and its output rounded to bf16).
Floor: the selected cells' K and V (fp16) and their ids read once a query, plus q and the output, over the measured
copy bandwidth.
"""

from __future__ import annotations

import argparse
import sys

import torch

from strata.bench.ceilings import Timer, copy_bandwidth
from strata.bench.prompt_attn import add_data_args, make_selections

DEFAULT_SWEEP = ["q1c32w8s3", "q1c32w8s2", "q1c32w4s3", "q1c32w4s2", "q1c16w4s3", "q1c16w8s3", "q1c64w8s2",
                 "q1c32w4s3r128", "q1h6c32w4s3", "q2h0c32w8s3", "q2h6c32w4s3", "q4h4c32w8s3", "q4h4c32w4s3",
                 "q8h2c32w8s3", "q1c32w8s3k2"]


def floor_bytes(width: torch.Tensor, n_kv_heads: int, n_heads: int, dim: int) -> int:
    """fp16 K and V of every selected cell and KV head, the cell's id, once a query; q and the output in fp32."""
    cells = int(width.long().sum())
    return cells * (n_kv_heads * 2 * dim * 2 + 4) + 2 * width.shape[0] * n_heads * dim * 4


def make_case(ctx: int, n_tokens: int, args, device: torch.device):
    """(cache, q, k, v, start, (ids, width)): a one-layer fp16 KVCache holding ctx - T cells, the chunk's inputs."""
    from strata.engine.kv import KVCache

    g = torch.Generator(device=device).manual_seed(args.seed)
    cache = KVCache(1, args.kv_heads, args.dim, ctx, torch.float16, device, initial_tokens=ctx)
    start = ctx - n_tokens
    cache.keys[0][:start] = torch.randn(start, args.kv_heads, args.dim, generator=g, device=device).half()
    cache.values[0][:start] = torch.randn(start, args.kv_heads, args.dim, generator=g, device=device).half()
    q = (torch.randn(n_tokens, args.heads, args.dim, generator=g, device=device) * 2).bfloat16()
    k = torch.randn(n_tokens, args.kv_heads, args.dim, generator=g, device=device).bfloat16()
    v = torch.randn(n_tokens, args.kv_heads, args.dim, generator=g, device=device).bfloat16()
    cap = args.top_k + 3
    ids, width = (t.to(device) for t in make_selections(ctx, n_tokens, cap, min(args.recent, cap), args.seed))
    return cache, q, k, v, start, (ids, width)


def run_context(ctx: int, args, device: torch.device, bandwidth: float) -> bool:
    from strata import switches
    from strata.kernels.attention.prompt_blocks import PromptConfig
    from strata.kernels.attention.prompt_dense import (DEFAULT, ERROR_FLOOR, dense_selected_attention,
                                                         dense_selected_ref)

    n_tokens = min(args.tokens, ctx)
    cache, q, k, v, start, selection = make_case(ctx, n_tokens, args, device)
    cache.kernels = True  # the kernel also under the interpreter
    timer = Timer(device)
    new = cache.attend(0, q, k, v, start, selection)  # stores the chunk's keys: the kernels read them from here
    keys, values = cache.keys[0], cache.values[0]
    ids, width = selection
    sample = torch.arange(0, n_tokens, max(1, n_tokens // 16), device=device)
    ref = dense_selected_ref(q[sample], keys, values, ids[sample], width[sample])
    scale = ref.abs().max().item()
    err_fp32 = (dense_selected_ref(q[sample], keys, values, ids[sample], width[sample], dtype=torch.float32).double()
                - ref).abs().max().item()
    floor_ms = floor_bytes(width, args.kv_heads, args.heads, args.dim) / bandwidth * 1e3
    n_sparse = max(0, min(n_tokens, ctx - args.top_k - 3))
    print(f"ctx {ctx} x {n_tokens} queries ({args.heads}/{args.kv_heads} heads x {args.dim}, width <= "
          f"{args.top_k + 3}, {n_sparse} sparse): floor {floor_ms:.3f} ms; output scale {scale:.3f}; "
          f"fp32 reference vs FP64 {err_fp32 / scale:.2e}")

    def bound(out: torch.Tensor) -> tuple[bool, float]:
        err = (out[sample].double() - ref).abs().max().item()
        return err <= max(4 * err_fp32, ERROR_FLOOR * scale), err / scale

    ok = True
    rows = []
    if args.old:
        with switches.override(STRATA_QSA_DENSE_MASK=True):
            old = cache.attend(0, q, k, v, start, selection)
            timer(lambda: cache.attend(0, q, k, v, start, selection), 1)
            old_ms = timer(lambda: cache.attend(0, q, k, v, start, selection), args.reps)
        rows.append(("info", "dense-mask SDPA (old)", old_ms, bound(old)[1]))
    timer(lambda: cache.attend(0, q, k, v, start, selection), 1)
    new_ms = timer(lambda: cache.attend(0, q, k, v, start, selection), args.reps)
    good, err = bound(dense_selected_attention(q, keys, values, ids, width))  # before the cast to q's dtype
    ok &= good
    rows.append(("PASS" if good else "FAIL", f"kernel {DEFAULT.label}", new_ms, err))
    for status, name, ms, e in rows:
        print(f"  {status} {name:<28} {ms:9.3f} ms  {ms / floor_ms:6.2f}x floor  vs FP64 {e:.2e}")
    if args.old:
        diff = (new.float() - old.float()).abs().max().item() / scale
        print(f"  KVCache.attend (both {q.dtype} out; the old error mostly bf16's rounding): the kernel "
              f"{old_ms / new_ms:.2f}x as fast as the old path; |kernel - old| {diff:.2e} of the output scale")
    ok &= decode_step(cache, q, k, v, (ids, width), args, timer, scale)
    if args.sweep is not None:
        labels = [DEFAULT.label] + [c for c in (args.sweep or DEFAULT_SWEEP) if c != DEFAULT.label]
        base, seen = None, set()
        for label in labels:
            try:
                config = PromptConfig.parse(label)
                if config in seen:  # the default under another spelling
                    continue
                seen.add(config)
                call = lambda config=config: dense_selected_attention(q, keys, values, ids, width, config=config)
                out = call()
                timer(call, 1)
                ms = timer(call, args.reps)
            except Exception as e:  # noqa: BLE001  (a config that cannot run is a row, not the end)
                print(f"  FAIL sweep {label:<18} {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                ok = False
                continue
            base = base or ms
            good, err = bound(out)
            ok &= good
            print(f"  {'PASS' if good else 'FAIL'} sweep {label:<18} {ms:9.3f} ms  {base / ms:5.2f}x default  "
                  f"{ms / floor_ms:5.2f}x floor  vs FP64 {err:.2e}{'  (default)' if label == DEFAULT.label else ''}")
    return ok


def decode_step(cache, q, k, v, selection, args, timer, scale: float) -> bool:
    """The chunk's last query as a one-token step through KVCache.attend: the old path (it concatenates the whole
    past) against the kernel's decode config (ROW_EXACT: split-K); with --sweep, other split counts for the step."""
    from dataclasses import replace

    from strata import switches
    from strata.kernels.attention.prompt_dense import (ERROR_FLOOR, ROW_EXACT, dense_selected_attention,
                                                         dense_selected_ref)

    ids, width = (t[-1:] for t in selection)
    one = (q[-1:], k[-1:], v[-1:], cache.keys[0].shape[0] - 1, (ids, width))
    keys, values = cache.keys[0], cache.values[0]
    ref = dense_selected_ref(one[0], keys, values, ids, width)
    err_fp32 = (dense_selected_ref(one[0], keys, values, ids, width, dtype=torch.float32).double() - ref).abs().max()
    rows = []
    if args.old:
        with switches.override(STRATA_QSA_DENSE_MASK=True):
            timer(lambda: cache.attend(0, *one), 1)
            rows.append(("info", "old", timer(lambda: cache.attend(0, *one), args.reps), None))
    splits = [ROW_EXACT.splits]
    if args.sweep is not None:
        splits += [s for s in (1, 4, 8, 32) if s != ROW_EXACT.splits]
    ok = True
    for n in splits:
        config = replace(ROW_EXACT, splits=n)
        call = lambda config=config: dense_selected_attention(one[0], keys, values, ids, width, config=config)
        err = (call().double() - ref).abs().max().item()
        good = err <= max(4 * err_fp32.item(), ERROR_FLOOR * scale)
        ok &= good
        timer(call, 1)
        rows.append(("PASS" if good else "FAIL", config.label + ("  (ROW_EXACT)" if n == ROW_EXACT.splits else ""),
                     timer(call, args.reps), err / scale))
    for status, name, ms, err in rows:
        print(f"  {status} decode step {name:<24} {ms * 1e3:9.1f} us" + ("" if err is None else f"  vs FP64 {err:.2e}"))
    return ok


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="strata bench qsa-attn", description=__doc__.split("\n\n")[0])
    p.add_argument("--ctx", default="4096,32768", help="contexts, comma-separated (the chunk ends at each)")
    p.add_argument("--tokens", type=int, default=2419, help="queries in the chunk (the engine's chunk)")
    p.add_argument("--reps", type=int, default=5)
    add_data_args(p)
    p.add_argument("--no-old", dest="old", action="store_false", help="skip the dense-mask SDPA")
    p.add_argument("--sweep", nargs="*", metavar="CONFIG",
                   help="time the kernel over tunable sets such as q1c32w4s3 (queries and heads per program, chunk, "
                        "warps, stages, r128 a register cap; none given: a built-in list) beside its default")
    p.add_argument("--sass", nargs="*", metavar="CONFIG",
                   help="no timing: compile the kernel for sm_90 here (no GPU needed) and print each config's "
                        "registers, spills, shared memory and chunk-loop instructions (none given: --sweep's list)")
    return p


def main(argv: list[str] | None = None) -> int:
    """One block per context; 0 if the kernel passes its bound everywhere, else 1."""
    args = parser().parse_args(argv)
    if args.sass is not None:
        from strata.bench.qsa_attn_sass import run_sass

        return run_sass(args, args.sass, sys.argv[1:] if argv is None else argv)
    device = torch.device(args.device)
    bandwidth = copy_bandwidth(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton interpreter)"
    print(f"QSA selected attention over an fp16 cache on {name}, torch {torch.__version__}; copy bandwidth "
          f"{bandwidth / 1e12:.2f} TB/s")
    ok = True
    for ctx in (int(c) for c in args.ctx.split(",")):
        ok &= run_context(ctx, args, device, bandwidth)
    print("all PASS" if ok else "some FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
