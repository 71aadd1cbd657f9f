"""What one static decode step launches, counted on the CPU: the engine's captured-decode program (its CPU form)
run under torch.profiler, leaf aten ops listed by count and name per token. On a GPU each of them would be a kernel
(views and allocations excluded: they launch nothing), so the list shows what is left to fuse. Only the graphs'
segments count: the host's uploads and, behind an expert cache, its lookups and the CPU pool do not.

`--fused` also takes the one-launch pointwise kernels (models/layers.py `_fused`: RMSNorm, q/k norm + RoPE, routing,
the residual add + norm, the KV write, the shared-expert gate, the GatedDeltaNet conv + gates and output gate,
qwen4exp's hyper-connection reads: kernels/hc) and
the dense decode attention on the CPU, run by Triton's interpreter and counted as one launch each, as the GPU runs
them; the GatedDeltaNet input projections are stacked into one matvec as on the GPU (models/stacked_projections.py).
The GEMV, expert GEMV and delta-rule calls keep their torch references here and count once a call (STAND_INS).

Usage: python tools/count_step_kernels.py MODEL.gguf [--fused] [--steps N] [--dtype bfloat16] [--kv-dtype float16]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported (the --fused launches)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

# Ops that only describe or allocate memory: no kernel on a GPU.
NO_LAUNCH = {
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::view", "aten::reshape", "aten::_reshape_alias",
    "aten::as_strided", "aten::slice", "aten::select", "aten::t", "aten::transpose", "aten::permute", "aten::expand",
    "aten::unsqueeze", "aten::squeeze", "aten::split", "aten::split_with_sizes", "aten::unflatten", "aten::flatten",
    "aten::detach", "aten::alias", "aten::lift_fresh", "aten::set_", "aten::resize_", "aten::unbind",
    "aten::narrow", "aten::chunk", "aten::numpy_T", "aten::view_as", "aten::unfold", "aten::_unsafe_view",
    "aten::result_type", "aten::is_nonzero", "aten::item", "aten::_local_scalar_dense", "aten::to", "aten::_to_copy",
    "aten::contiguous", "aten::clone", "aten::expand_as", "aten::movedim", "aten::new_empty",
    "aten::new_empty_strided", "aten::_has_compatible_shallow_copy_type",
}
TRITON = "triton::"
STEP = "decode step"


def count_launches(events, where: bool = False) -> Counter:
    """Launches by name: leaf aten ops that compute (outside a Triton launch) and the Triton launches; `where`
    adds the innermost strata source line that called each (a profile recorded with_stack)."""
    counts: Counter = Counter()
    for e in events:
        if e.name.startswith(TRITON):
            outer = e.cpu_parent
            while outer is not None and not outer.name.startswith(TRITON):
                outer = outer.cpu_parent
            if outer is None:  # a stand-in that runs Triton under the interpreter counts once
                counts[e.name] += 1
            continue
        if not e.name.startswith("aten::") or e.name in NO_LAUNCH:
            continue
        if any(c.name.startswith("aten::") and c.name not in NO_LAUNCH for c in _descendants(e)):
            continue  # a composite op: its children are the launches
        parent, inside, in_step = e.cpu_parent, False, False
        while parent is not None:
            inside = inside or parent.name.startswith(TRITON)  # the interpreter's own host copies
            in_step = in_step or parent.name == STEP
            parent = parent.cpu_parent
        if in_step and not inside:
            counts[(e.name, _caller(e)) if where else e.name] += 1
    return counts


def _caller(event) -> str:
    while event is not None:  # with_stack, the Python frames are the op's ancestors in the profile
        if ".py(" in event.name and "strata/" in event.name:
            return event.name.split("strata/", 1)[-1]
        event = event.cpu_parent
    return "?"


def _descendants(event):
    for child in event.cpu_children:
        yield child
        yield from _descendants(child)


def named_triton_launches() -> None:
    """Each interpreted Triton launch appears in the profile as one `triton::<kernel>` range."""
    from triton.runtime.interpreter import InterpretedFunction

    run = InterpretedFunction.run

    def traced(self, *args, grid, warmup, **kwargs):
        with record_function(TRITON + self.fn.__name__):
            return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = traced


# What a GPU runs as its own kernels (GEMV, expert GEMV, attention, the delta rule) while the CPU runs a torch
# reference of many ops: each call counts as one launch, under its label.
STAND_INS = [
    ("strata.models.weights", "linear", "gemv"),
    ("strata.engine.experts", "ResidentExperts.start", "expert gemv"),
    ("strata.engine.experts", "CachedExperts.hits_part", "expert gemv (cache slots)"),
    ("torch.nn.functional", "scaled_dot_product_attention", "attention"),
    ("strata.kernels.attention.prompt", "prompt_attention", "attention"),
    ("strata.kernels.gdn", "gated_delta_rule", "gated delta rule"),
]


def stand_in_kernels() -> None:
    """Wrap each STAND_INS function (wherever a module imported it by name) in a `triton::<label>` range."""
    import importlib

    for module_name, qualname, label in STAND_INS:
        owner = importlib.import_module(module_name)
        *path, name = qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = getattr(owner, name)

        def wrapped(*args, _original=original, _label=label, **kwargs):
            with record_function(TRITON + _label):
                return _original(*args, **kwargs)

        setattr(owner, name, wrapped)
        if not path:  # `from module import fn` copies elsewhere
            for module in list(sys.modules.values()):
                if module is not None and getattr(module, name, None) is original:
                    setattr(module, name, wrapped)


def count_only_the_graphs() -> None:
    """Count what a CUDA graph would replay (the program's segments), not the host's uploads and bookkeeping."""
    from strata.engine.decode import StepGraphs

    run = StepGraphs.run

    def traced(self, j):
        with record_function(STEP):
            return run(self, j)

    StepGraphs.run = traced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--fused", action="store_true", help="run the pointwise Triton kernels (interpreted)")
    parser.add_argument("--steps", type=int, default=2, help="decode steps profiled (counts are per token)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--kv-dtype", default="float16")
    parser.add_argument("--expert-cache", default="auto")
    parser.add_argument("--top", type=int, default=40, help="op names listed")
    parser.add_argument("--where", action="store_true", help="list ops by the strata line that called them")
    args = parser.parse_args()

    import strata.models.qwen3next  # noqa: F401  (imported before the stand-ins replace what it imports)
    from strata.engine.engine import Engine, EngineConfig
    from strata.models import layers

    if args.fused:
        layers.FUSED_ON_CPU = True
    named_triton_launches()
    stand_in_kernels()
    count_only_the_graphs()
    engine = Engine(args.model, EngineConfig(device="cpu", dtype=args.dtype, kv_dtype=args.kv_dtype,
                                             expert_cache=args.expert_cache, decode_graphs="eager"))
    if engine.decoder is None:
        raise SystemExit("count_step_kernels: this model and cache have no static decode step (see the line above)")
    logits = engine.prefill([5, 17, 99, 3, 250, 7, 31])
    position = 7

    def step():
        nonlocal logits, position
        logits = engine.decode(int(logits[-1].argmax()), position)
        position += 1

    step()  # the first static step builds the program's buffers
    with profile(activities=[ProfilerActivity.CPU], with_stack=args.where) as prof:
        for _ in range(args.steps):
            step()
    counts = count_launches(prof.events(), args.where)
    total = sum(counts.values()) / args.steps
    c = engine.model.config
    print(f"{Path(args.model).name}: {c.arch}, {c.n_layers} layers, {args.dtype}, KV {args.kv_dtype}, "
          f"experts {engine.model.experts.name}, fused kernels {'on (interpreted)' if args.fused else 'off (torch)'}")
    print(f"launches per token: {total:.1f} ({total / c.n_layers:.1f} per layer)")
    for name, n in counts.most_common(args.top):
        print(f"{n / args.steps:8.1f}  {name if isinstance(name, str) else '  '.join(name)}")


if __name__ == "__main__":
    main()
