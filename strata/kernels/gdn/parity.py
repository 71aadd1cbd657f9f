"""Parity and speed of the gated delta rule forms against float64, at a chosen size (default: Qwen3-Next's).

    python -m strata.kernels.gdn.parity [--tokens 4096 --k-heads 16 --v-heads 32 --dim 128 --dtype bfloat16]

Prints one line per form: ms per call, relative error of the output and of the final state against a float64
step-by-step run on the same (rounded) inputs, and PASS/FAIL against the bound beside it. Forms: fla-core's chunk
and fused-recurrent kernels (when importable, on CUDA), our torch chunked and recurrent forms, and a decode step
(one token from a carried state).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from strata.kernels.gdn import (
    fla_kernels,
    gated_delta_rule_chunked,
    gated_delta_rule_f64,
    gated_delta_rule_fla,
    gated_delta_rule_recurrent,
)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# Bounds on max|error| / max|reference|: inputs in 16 bits leave the kernels' internal rounding; float32 not.
BOUNDS = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}


def make_inputs(n_tokens, n_k_heads, n_v_heads, dim, dtype, device, seed=0):
    """Model-like inputs: raw q/k (normalised in the kernels), decays from -exp(A) softplus(.), beta in (0, 1)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    q, k = randn(n_tokens, n_k_heads, dim), randn(n_tokens, n_k_heads, dim)
    v = randn(n_tokens, n_v_heads, dim)
    g = -(randn(n_v_heads) - 1).exp() * F.softplus(randn(n_tokens, n_v_heads))
    beta = randn(n_tokens, n_v_heads).sigmoid()
    state = randn(n_v_heads, dim, dim) * 0.1
    return [x.to(device) for x in (q.to(dtype), k.to(dtype), v.to(dtype), g, beta, state)]


def relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.to(ours.device)
    return ((ours.double() - ref).abs().max() / ref.abs().max()).item()


def timed(fn, device, reps):
    fn()  # compile / autotune
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return result, (time.perf_counter() - start) / reps * 1e3


def reference(q, k, v, g, beta, state):
    """float64, one token at a time (every head at once), on the inputs' device; checked against the per-head
    definition on a slice so the fast float64 loop is itself known right."""
    out, final = gated_delta_rule_recurrent(q.double(), k.double(), v.double(), g, beta, state.double())
    n = min(8, q.shape[0])
    heads_k = max(1, q.shape[1] // 4)
    heads_v = heads_k * (v.shape[1] // q.shape[1])
    slice_out, _ = gated_delta_rule_f64(q[:n, :heads_k], k[:n, :heads_k], v[:n, :heads_v], g[:n, :heads_v],
                                        beta[:n, :heads_v], state[:heads_v])
    check = relative_error(out[:n, :heads_v].double(), slice_out)
    if check > 1e-10:
        raise RuntimeError(f"float64 loop disagrees with the definition: {check:.2e}")
    return out, final


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--k-heads", type=int, default=16)
    parser.add_argument("--v-heads", type=int, default=32)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    q, k, v, g, beta, state = make_inputs(args.tokens, args.k_heads, args.v_heads, args.dim, dtype, device)
    ref_out, ref_state = reference(q, k, v, g, beta, state)
    # The decode step: the last token from the state after all the others.
    _, before_last = gated_delta_rule_recurrent(q[:-1], k[:-1], v[:-1], g[:-1], beta[:-1], state.double())
    last = [x[-1:] for x in (q, k, v, g, beta)]

    forms = {"torch chunked": lambda *a: gated_delta_rule_chunked(*a),
             "torch recurrent": lambda *a: gated_delta_rule_recurrent(*a)}
    decode = {"torch recurrent": lambda *a: gated_delta_rule_recurrent(*a)}
    if device.type == "cuda" and fla_kernels() is not None:
        forms = {"fla chunk": lambda *a: gated_delta_rule_fla(*a, recurrent=False),
                 "fla fused_recurrent": lambda *a: gated_delta_rule_fla(*a, recurrent=True), **forms}
        decode = {"fla fused_recurrent": lambda *a: gated_delta_rule_fla(*a, recurrent=True), **decode}
    elif device.type == "cuda":
        print("fla-core is not importable: torch forms only")

    bound = BOUNDS[dtype]
    shape = f"T={args.tokens} Hk={args.k_heads} Hv={args.v_heads} D={args.dim} {args.dtype} on {device}"
    print(f"gated delta rule, {shape}; bound {bound:g} (max|err| / max|ref| vs float64)")
    print(f"{'form':34} {'ms':>10} {'out err':>10} {'state err':>10}")
    rows = []
    for what, table, inputs, (want_out, want_state) in (
        ("prompt", forms, (q, k, v, g, beta, state), (ref_out, ref_state)),
        ("decode 1 token", decode, (*last, before_last.float()), gated_delta_rule_f64(*last, before_last)),
    ):
        for name, fn in table.items():
            reps = args.reps if what == "decode 1 token" or "recurrent" not in name or "fla" in name else 1
            (out, final), ms = timed(lambda: fn(*inputs), device, reps)
            row = dict(form=f"{name} ({what})", ms=ms, out=relative_error(out, want_out),
                       state=relative_error(final, want_state))
            row["ok"] = row["out"] < bound and row["state"] < bound
            rows.append(row)
            print(f"{row['form']:34} {ms:10.3f} {row['out']:10.2e} {row['state']:10.2e}  {'PASS' if row['ok'] else 'FAIL'}")
    return rows


if __name__ == "__main__":
    main()
