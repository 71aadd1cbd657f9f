"""Kernels built for sm_90 without a GPU (Triton's bundled ptxas): a test file run as a script (its `__main__`
block, the interpreter off) builds them and prints one JSON line a build; its test reads them back."""

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import triton

ROOT = Path(__file__).resolve().parents[2]
needs_ptxas = pytest.mark.skipif(not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists(),
                                 reason="this Triton build carries no ptxas")


def builds_of(test_file: str, timeout: int = 300) -> list[dict]:
    """The JSON lines `test_file` prints when run as a script, the interpreter off."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    run = subprocess.run([sys.executable, test_file], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads(line) for line in run.stdout.splitlines()]


def cubin_report(kernel, signature: dict, constants: dict, warps: int, unaligned: tuple = (),
                 fusion: bool = True) -> tuple[int, int, str]:
    """(registers, spill stack, SASS) of `kernel` built for sm_90 (call it with the interpreter off); the arguments
    of `signature` but `unaligned` specialized as 16-divisible, as a launch at the layer's shapes would."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in signature if n not in unaligned}
    source = ASTSource(kernel, {**signature, **{c: "constexpr" for c in constants}}, constants, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": warps, "enable_fp_fusion": fusion})
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([str(tools / "cuobjdump"), "--dump-resource-usage", f.name], capture_output=True,
                               text=True).stdout
        sass = subprocess.run([str(tools / "cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout
    regs, stack = re.search(r"REG:(\d+) STACK:(\d+)", usage).groups()
    return int(regs), int(stack), sass


def sass_counts(kernel, signature: dict, constants: dict, warps: int,
                fusion: bool = True) -> tuple[int, int, int, int]:
    """(registers, spill stack, SASS instructions that run, IDP.4A among them) of a kernel built for sm_90;
    pointers and sizes specialized as 16-divisible, as a launch would (strides not)."""
    unaligned = tuple(n for n in signature if n.startswith("stride"))
    regs, stack, sass = cubin_report(kernel, signature, constants, warps, unaligned, fusion)
    lines = [line for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/\s+[A-Z]", line)]
    executed = [line for line in lines if not re.search(r"\s(NOP|BRA)\b", line)]  # (the padding after EXIT)
    return regs, stack, len(executed), sum("IDP.4A" in line for line in lines)
