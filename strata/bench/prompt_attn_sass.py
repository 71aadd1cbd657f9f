"""`strata bench prompt-attn --sass [CONFIG ...]`: the blocked prompt kernels compiled for sm_90 on this machine, no GPU
needed (Triton's code generator and the ptxas and cuobjdump its wheel ships), one line per variant and config:
registers, spilled bytes, shared memory, the programs an H200 SM holds by them, and the chunk loop's SASS instruction
count with its commonest opcodes. Not a timing: it says what a config costs per chunk before a device run, and where
(the loop's conversions, shared-memory loads, barriers, dots).

The kernel is compiled for the parity tool's geometry (24 query / 2 KV heads of 256, one query a program unless the
config says otherwise), with the launch's argument alignments; `maxnreg` as the config's `r`.
"""

from __future__ import annotations

import collections
import inspect
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import replace

from strata.errors import StrataError

TARGET = (90, 32)  # sm_90 (H100/H200), warp size 32
SM_REGS, SM_SMEM, SM_THREADS = 65536, 233472, 2048
POINTERS = ("q_ptr", "out_ptr", "parts_ptr", "ml_ptr", "cells_ptr", "members_ptr", "count_ptr", "page_table_ptr",
            "k_ptr", "v_ptr", "ks_ptr", "vs_ptr")
POINTER_TYPES = ("*fp32",) * 4 + ("*i32",) * 4 + ("*i8", "*i8", "*fp16", "*fp16")


def _tool(name: str) -> str:
    import triton

    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    if not os.path.exists(path):
        raise StrataError(f"bench prompt-attn --sass: {path} is missing (Triton's NVIDIA backend binaries)")
    return path


def _kernel_and_meta(variant: str, config, dim: int) -> tuple[object, dict]:
    """The Triton kernel a launch of `variant` with `config` runs, and the constexprs that launch passes."""
    from strata.kernels.attention import prompt_imma, prompt_imma_cells, prompt_v2

    meta = {"NG": dim // 64, "EXACT": config.exact}
    if config.halves:
        meta["HALVES"] = True
    if variant == "imma":
        prompt_imma.check_config(config)
        meta["PV"] = config.pv or 8
        if config.qparts:
            meta["QPARTS"] = config.qparts
        if config.early:
            meta["EARLY"] = config.early
        meta.update(prompt_imma.uniform_flags(config))
        if config.prefix:  # the prefix launch (the one-query launch beside it is the one-query config's kernel)
            meta["PREFIX"] = 1
        kernel = prompt_imma_cells._prompt_imma_cells_kernel if config.scores else prompt_imma._prompt_imma_kernel
    else:
        kernel = prompt_v2._prompt_v2_kernel
    if config.order:
        meta["REVERSE"] = True
    return kernel, meta


def compile_offline(variant: str, config, heads: int = 24, kv_heads: int = 2, dim: int = 256, rest: int = 0):
    """Compile `variant` with `config` for sm_90 without a device; returns Triton's compiled kernel. `rest`: a prefix
    config's other launch instead (one query a program, the queries of blocks of `rest` that do not qualify)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    config = config.resolve(heads // kv_heads)
    kernel, meta = _kernel_and_meta(variant, config, dim)
    if rest:
        meta.update(PREFIX=2, FBQ=rest)
    stages = 1 if variant == "v2t" else config.stages
    constexprs = dict(G=heads // kv_heads, HP=config.heads, BQ=config.queries, BM=config.rows(), CH=config.chunk,
                      SPLITS=config.splits, PREFETCH=bool(config.prefetch),
                      TRANSLATED=2 if config.translate == 2 else bool(config.translate), **meta)
    for param in kernel.params:  # as a launch does: the kernel's own defaults for the constexprs left out
        if param.is_constexpr and param.name not in constexprs and param.default is not inspect.Parameter.empty:
            constexprs[param.name] = param.default
    signature = dict(zip(POINTERS, POINTER_TYPES))
    signature.update(block0="i32", n_q="i32", row_len="i32", n_kv_heads="i32", scale_log2="fp32")
    if "vbound_ptr" in kernel.arg_names:  # imma g1's V bound (fp16, as the launch passes it)
        signature["vbound_ptr"] = "*fp16"
    signature.update({name: "constexpr" for name in constexprs})
    # as a launch specializes them: 16-byte aligned pointers, block0 = 0 and n_q = 1024 divisible by 16
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(POINTERS) + 2)}
    options = {"num_warps": config.warps, "num_stages": stages}
    if config.maxreg:
        options["maxnreg"] = config.maxreg
    source = ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", *TARGET), options=options)


def cubin_resources(cubin: bytes) -> tuple[int, int, list[str]]:
    """(registers, spilled bytes, SASS lines) of a cubin, by cuobjdump."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", f.name], capture_output=True,
                               text=True, check=True).stdout
        sass = subprocess.run([_tool("cuobjdump"), "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout.splitlines()
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    local = int(re.search(r"STACK:(\d+)", usage).group(1))  # spilled registers live in the stack frame
    return regs, local, sass


def loop_opcodes(sass: list[str]) -> collections.Counter:
    """Opcodes of the largest loop (the span of the longest backward branch): the chunk loop of these kernels."""
    code = [(int(m.group(1), 16), m.group(2).strip()) for line in sass
            if (m := re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line))]
    spans = [(addr - int(m.group(1), 16), int(m.group(1), 16), addr) for addr, text in code
             if (m := re.search(r"BRA (?:`\(\.L_x_\d+\) )?0x([0-9a-f]+)", text)) and int(m.group(1), 16) < addr]
    if not spans:
        return collections.Counter()
    _, lo, hi = max(spans)
    return collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]
                               for addr, text in code if lo <= addr <= hi)


def programs_per_sm(regs: int, smem: int, warps: int) -> int:
    from strata.bench.prompt_attn_sweep import programs_per_sm as fit

    return fit(regs, smem, warps, SM_REGS, SM_SMEM, SM_THREADS)


def sass_line(variant: str, config, heads: int, kv_heads: int, dim: int, rest: int = 0) -> str:
    compiled = compile_offline(variant, config, heads, kv_heads, dim, rest)
    regs, local, sass = cubin_resources(compiled.asm["cubin"])
    ops = loop_opcodes(sass)
    smem = compiled.metadata.shared
    top = ", ".join(f"{op} {n}" for op, n in ops.most_common(8))
    return (f"  {variant:<5} {config.label:<24} {regs:3d} regs, {local:4d} B spilled, {smem / 1024:5.1f} KB smem: "
            f"{programs_per_sm(regs, smem, config.warps)}/SM; loop {sum(ops.values()):5d} instructions ({top})")


def run_sass(args, configs: list[str], argv: list[str]) -> int:
    """Print one line per variant and config (the variant's default first); 0 if every one compiled. Where Triton's
    interpreter is on (no GPU here: strata.kernels turned it on), the kernels are not compilable in this process:
    the same command runs again in a child with the interpreter off."""
    import triton

    from strata.bench.prompt_attn_sweep import SWEEP, SWEPT, _kernels, fits, imma_only
    from strata.kernels.attention import prompt_v2
    from strata.kernels.attention.prompt_blocks import PromptConfig

    if not isinstance(prompt_v2._prompt_v2_kernel, triton.runtime.jit.JITFunction):
        env = dict(os.environ, TRITON_INTERPRET="0")
        return subprocess.run([sys.executable, "-m", "strata.bench.prompt_attn", *argv], env=env).returncode

    print(f"prompt kernels compiled for sm_{TARGET[0]} on this machine ({args.heads}/{args.kv_heads} heads x "
          f"{args.dim}); programs per SM by H200 limits")
    ok = True
    for name in [n for n in args.variants if n in SWEPT]:
        default = _kernels()[name][1]
        for config in [default] + [PromptConfig.parse(text) for text in (configs or SWEEP)]:
            if imma_only(config) and name != "imma" or not fits(name, config):
                continue  # as the sweep: imma's own options, or a combination the variant refuses
            try:
                print(sass_line(name, config, args.heads, args.kv_heads, args.dim), flush=True)
                if config.prefix:  # and the launch of the queries whose blocks do not qualify
                    one = replace(config, queries=1, heads=0, prefix=0)
                    print(sass_line(name, one, args.heads, args.kv_heads, args.dim, config.queries)
                          .replace(one.label, f"{one.label} (the rest)"), flush=True)
            except Exception as e:  # noqa: BLE001  (a config that does not compile is reported)
                ok = False
                print(f"  {name:<5} {config.label:<24} failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    return 0 if ok else 1
