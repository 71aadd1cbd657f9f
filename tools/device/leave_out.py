"""On the GPU: how much of a decode step each of its kernels costs, by leaving it out (issue 4). H200.md's method
without counters: time variants that leave one stage out and take differences. Under PDL the kernels' increments
(`profile_decode.py --increments`) do not add as arms do (session 19: q/k/v's dp4a matvec 2.2 us a layer faster in
its increment, the step 0.02 ms), so this asks the arm's question directly: the step with a stage gone.

Each stage named by --leave is replaced, in decode steps (1-4 rows) only, by a zero tensor of its output's shape
made once (the first, eager, step) and read by the captured ones: no launch, no bytes. The tokens are then
meaningless; only the step's time is the point. Stages:
  qkv      the stacked q/k/v matvec (`project_inputs`)
  attn     the q/k norm + RoPE + KV store and the attention (`ForwardContext.attend_normed`)
  o        the o matvec (the decoder's `linear` on an attention o weight)
  route    the residual add + norm + router + top-8 (`add_norm_route`: h and its "norm" passed on, ids 0..k-1)
  gate_up  the experts' gate/up + SwiGLU (`gemv.gate_up_swiglu_triton`)
  down     the experts' down sum (`gemv.down_sum_triton`)
(The add + norm closing a layer is not among them: passing h on as its own norm made the H200's capture fault,
session 19, not looked into.)
Then runs `strata bench decode` in this process with the remaining arguments.

Usage: python3 tools/device/leave_out.py --leave qkv,o -- MODEL.gguf --device cuda --vram-budget 24 ...
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

STAGES = ("qkv", "attn", "o", "route", "gate_up", "down")
_zeros: dict = {}


def kept(key, make) -> torch.Tensor:
    """A tensor made once per key: in the eager first step, read (not made) inside the graphs."""
    if key not in _zeros:
        _zeros[key] = make()
    return _zeros[key]


def zeros(shape, dtype, device) -> torch.Tensor:
    return kept((tuple(shape), dtype, str(device)), lambda: torch.zeros(shape, dtype=dtype, device=device))


def decode_rows(t: torch.Tensor) -> bool:
    return t.is_cuda and t.shape[0] <= 4


def leave(stages: set) -> None:
    from strata.engine.context import ForwardContext
    from strata.kernels.moe import gemv
    from strata.models import decoder

    if "qkv" in stages:
        real_project = decoder.project_inputs

        def project_inputs(x, stacked, n, parts, biases):
            if not decode_rows(x):
                return real_project(x, stacked, n, parts, biases)
            return tuple(zeros((x.shape[0], p.shape[0]), x.dtype, x.device) for p in parts)

        decoder.project_inputs = project_inputs
    if "attn" in stages:  # the context and its subclasses (the graphs' static step context) that define it
        from strata.engine import decode  # noqa: F401  (its context class among the subclasses)

        for cls in (ForwardContext, *ForwardContext.__subclasses__()):
            if "attend_normed" in cls.__dict__:
                def attend_normed(self, i, q, k, v, norms, _real=cls.__dict__["attend_normed"]):
                    return zeros(q.shape, q.dtype, q.device) if decode_rows(q) else _real(self, i, q, k, v, norms)

                cls.attend_normed = attend_normed
    if "o" in stages:
        real_linear = decoder.linear

        def linear(x, w, *a, **k):
            if decode_rows(x) and getattr(w, "name", "").endswith("attn_output.weight"):
                return zeros((x.shape[0], w.shape[0]), x.dtype, x.device)
            return real_linear(x, w, *a, **k)

        decoder.linear = linear
    if "route" in stages:
        real_route = decoder.add_norm_route

        def add_norm_route(h, delta, weight, router, eps, k, normalize, quantize=False):
            if not decode_rows(h):
                return real_route(h, delta, weight, router, eps, k, normalize, quantize)
            ids = kept(("ids", h.shape[0], k), lambda: torch.arange(k, dtype=torch.int32, device=h.device)
                       .repeat(h.shape[0], 1))
            weights = kept(("w", h.shape[0], k), lambda: torch.full((h.shape[0], k), 1.0 / k, device=h.device))
            return h, h, weights, ids

        decoder.add_norm_route = add_norm_route
    if "gate_up" in stages:
        real_gate_up = gemv.gate_up_swiglu_triton

        def gate_up(x, topk_ids, experts, *a, **k):
            if not decode_rows(x):
                return real_gate_up(x, topk_ids, experts, *a, **k)
            return zeros((*topk_ids.shape, experts.gate.rows), torch.float32, x.device)

        gemv.gate_up_swiglu_triton = gate_up
    if "down" in stages:
        real_down = gemv.down_sum_triton

        def down(h, topk_ids, topk_weights, experts, out_dtype=torch.float32, *a, **k):
            if not decode_rows(h):
                return real_down(h, topk_ids, topk_weights, experts, out_dtype, *a, **k)
            return zeros((topk_ids.shape[0], experts.down.rows), out_dtype, h.device)

        gemv.down_sum_triton = down


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--leave", default="", help=f"a comma list of {', '.join(STAGES)} (empty: none)")
    args, rest = parser.parse_known_args()
    named = {s for s in args.leave.split(",") if s}
    unknown = named - set(STAGES)
    if unknown:
        parser.error(f"--leave: {', '.join(sorted(unknown))} not among {', '.join(STAGES)}")
    leave(named)
    print(f"left out: {', '.join(sorted(named)) or 'nothing'}")
    from strata.cli import main as strata_main

    return strata_main(["bench", "decode", *[a for a in rest if a != "--"]])


if __name__ == "__main__":
    sys.exit(main())
