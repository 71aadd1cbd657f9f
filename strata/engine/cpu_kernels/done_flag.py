"""Waiting for the pool's result without a thread wake-up: the layer call stores its call number into a flag as its
last act, and the decode thread spins on that flag (an atomic acquire load, a pause between reads) in native code
called through ctypes, which releases the GIL, so the worker thread is never kept from it. Past `spins` reads it
gives up (False) and the caller falls back to the blocking wait.
"""

from __future__ import annotations

import ctypes

import llvmlite.binding as llvm

_IR = """
{declare}
define i64 @strata_wait_flag(i64 %p, i64 %target, i64 %spins) {{
entry:
  %ptr = inttoptr i64 %p to ptr
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %cont]
  %v = load atomic i64, ptr %ptr acquire, align 8
  %ok = icmp sge i64 %v, %target
  br i1 %ok, label %yes, label %cont
cont:
{pause}
  %i1 = add i64 %i, 1
  %more = icmp ult i64 %i1, %spins
  br i1 %more, label %loop, label %no
yes:
  ret i64 1
no:
  ret i64 0
}}
"""

_engine = None
_wait = None


def _compile():
    global _engine, _wait
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    x86 = llvm.get_process_triple().startswith("x86_64")
    text = _IR.format(declare="declare void @llvm.x86.sse2.pause()" if x86 else "",
                      pause="  call void @llvm.x86.sse2.pause()" if x86 else "")
    mod = llvm.parse_assembly(text)
    mod.verify()
    machine = llvm.Target.from_triple(llvm.get_process_triple()).create_target_machine(opt=2)
    _engine = llvm.create_mcjit_compiler(mod, machine)
    _engine.finalize_object()
    _wait = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)(
        _engine.get_function_address("strata_wait_flag"))


def wait_flag(address: int, target: int, spins: int) -> bool:
    """True once the int64 at `address` is >= target, False after `spins` reads without it (GIL released)."""
    if _wait is None:
        _compile()
    return bool(_wait(address, target, spins))
