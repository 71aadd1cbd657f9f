"""`strata bench qsa-attn --sass [CONFIG ...]`: the selected-cells kernel (prompt_dense.py) compiled for sm_90 here, no
GPU needed, one line per config: registers, spilled bytes, shared memory, programs an H200 SM holds by them, the
chunk loop's SASS instruction count and commonest opcodes (as `bench prompt-attn --sass`). Not a timing.

Compiled for the bench's geometry (--heads / --kv-heads / --dim) with the launch's specializations: 16-byte aligned
pointers, the cache's strides divisible by 16 (without that hint the loads lose their vector width and async copies).
"""

from __future__ import annotations

import os
import subprocess
import sys

POINTERS = ("q_ptr", "out_ptr", "parts_ptr", "ml_ptr", "cells_ptr", "members_ptr", "count_ptr", "k_ptr", "v_ptr")
POINTER_TYPES = ("*fp32",) * 4 + ("*i32",) * 3 + ("*fp16",) * 2
INTS = ("block0", "n_q", "row_len", "n_kv_heads", "stride_cell", "stride_head")


def compile_offline(config, heads: int, kv_heads: int, dim: int):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from strata.bench.prompt_attn_sass import TARGET
    from strata.kernels.attention.prompt_dense import _dense_selected_kernel

    config = config.resolve(heads // kv_heads)
    constexprs = dict(G=heads // kv_heads, HP=config.heads, BQ=config.queries, BM=config.rows(), CH=config.chunk,
                      D=dim, SPLITS=config.splits)
    signature = dict(zip(POINTERS, POINTER_TYPES)) | {name: "i32" for name in INTS} | {"scale_log2": "fp32"}
    signature.update({name: "constexpr" for name in constexprs})
    aligned = [*range(len(POINTERS)), len(POINTERS) + INTS.index("stride_cell"),
               len(POINTERS) + INTS.index("stride_head")]
    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    options = {"num_warps": config.warps, "num_stages": config.stages}
    if config.maxreg:
        options["maxnreg"] = config.maxreg
    source = ASTSource(_dense_selected_kernel, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", *TARGET), options=options)


def run_sass(args, configs: list[str], argv: list[str]) -> int:
    """One line per config (the default first); 0 if every one compiled. Under Triton's interpreter (no GPU here)
    the same command runs again in a child with the interpreter off."""
    import triton

    from strata.bench.prompt_attn_sass import cubin_resources, loop_opcodes, programs_per_sm
    from strata.bench.qsa_attn import DEFAULT_SWEEP
    from strata.kernels.attention.prompt_blocks import PromptConfig
    from strata.kernels.attention.prompt_dense import DEFAULT, ROW_EXACT, _dense_selected_kernel

    if not isinstance(_dense_selected_kernel, triton.runtime.jit.JITFunction):
        env = dict(os.environ, TRITON_INTERPRET="0")
        return subprocess.run([sys.executable, "-m", "strata.bench.qsa_attn", *argv], env=env).returncode
    print(f"the selected-cells kernel compiled for sm_90 here ({args.heads}/{args.kv_heads} heads x {args.dim}); "
          "programs per SM by H200 limits")
    ok = True
    for config in [DEFAULT, ROW_EXACT] + [PromptConfig.parse(text) for text in (configs or DEFAULT_SWEEP)]:
        try:
            compiled = compile_offline(config, args.heads, args.kv_heads, args.dim)
            regs, spilled, sass = cubin_resources(compiled.asm["cubin"])
            ops = loop_opcodes(sass)
            smem = compiled.metadata.shared
            top = ", ".join(f"{op} {n}" for op, n in ops.most_common(8))
            print(f"  {config.label:<22} {regs:3d} regs, {spilled:4d} B spilled, {smem / 1024:5.1f} KB smem: "
                  f"{programs_per_sm(regs, smem, config.warps)}/SM; loop {sum(ops.values()):5d} instructions ({top})",
                  flush=True)
        except Exception as e:  # noqa: BLE001  (a config that does not compile is reported)
            ok = False
            print(f"  {config.label:<22} failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    return 0 if ok else 1
