"""Programmatic dependent launch (PDL, sm_90+) for the decode step's kernels, behind STRATA_PDL.

A decode step is a chain of small kernels (A3B: eight a layer, 1.7-9.4 us each), each mostly launch latency,
ramp-up and tail. Launched with PDL (Triton's `launch_pdl=True`: CUDA's programmatic stream serialization, kept as
programmatic edges when a stream is captured into a graph), a kernel's programs may start while its predecessor in
the stream is still running, once every program of the predecessor has called `griddepcontrol.launch_dependents`
(or exited). `griddepcontrol.wait` then blocks until the predecessor grid has completed and its memory is visible.

The rule every kernel taking part follows (so the chain is safe whatever runs ahead): it calls `pdl_wait` before its
first read of anything an earlier kernel of the step writes AND before its first global store or atomic. Since a
kernel completes only after its wait returned, completion is transitive: past its wait, every earlier kernel of
the stream has completed. Before the wait a kernel reads only what no kernel of the step writes: the dense matvec's
weight blocks, a router's rows, norm weights (loaded at start or kept since the first step), so the weight streaming
of a GEMV overlaps its predecessor's tail. Launches without PDL (torch ops, other Triton kernels) wait for full
completion as always, which breaks the chain harmlessly.

Modes (`STRATA_PDL`): 1, each program lets the next kernel launch at its very start (`pdl_start`: the most overlap;
several kernels ahead may become resident, each waiting); 2, only once past its own wait (at most the next kernel
waits beside this one); 3, as 1 except that the experts' gate/up kernel triggers past its wait, so that when the
experts' down kernel launches the routing (written before the gate/up kernel) is complete: the down kernel then reads
the routing (through L2) and streams its experts' weights before its wait (`routing_ahead`). In general a kernel
may read before its wait what a kernel W wrote if some kernel after W and before it triggers only past its own
wait. 0 (unset): no launch option and no constexpr is passed, so the kernels compile and run exactly as before (`PDL`
defaults to 0 in each kernel, and every line of this file's code sits under it).

Triton's interpreter cannot run `griddepcontrol` (inline assembly); under it the two instructions are no-ops, so
CPU tests can run each kernel's PDL form (its loads reordered around the wait) against the default form
(`FORCE_ON_CPU`).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from strata.errors import StrataError
from strata.kernels import INTERPRETED  # decided before Triton was imported

MODES = (0, 1, 2, 3)
FORCE_ON_CPU = False  # tests: CPU tensors take the PDL options too (the interpreter's no-op waits)

if INTERPRETED:
    @triton.jit
    def _gdc_wait():
        pass

    @triton.jit
    def _gdc_launch_dependents():
        pass
else:
    from triton.language.extra.cuda import gdc_launch_dependents as _gdc_launch_dependents
    from triton.language.extra.cuda import gdc_wait as _gdc_wait


def mode() -> int:
    """STRATA_PDL's mode (0 off), checked."""
    from strata import switches

    value = switches.get("STRATA_PDL")
    if value not in MODES:
        raise StrataError(f"environment switch STRATA_PDL={value} is not one of {', '.join(map(str, MODES))}")
    return value


def mode_for(t: torch.Tensor) -> int:
    """The mode a launch over tensor t takes: the switch's on a CUDA device of sm_90 or newer (PDL's hardware), 0
    elsewhere (CPU tensors take it only where a test sets FORCE_ON_CPU)."""
    wanted = mode()
    if not wanted:
        return 0
    if t.is_cuda:
        return wanted if _has_pdl(t.device.index if t.device.index is not None else torch.cuda.current_device()) else 0
    return wanted if FORCE_ON_CPU else 0


@functools.cache
def _has_pdl(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def launch_options(t: torch.Tensor, late: bool = False, **early) -> dict:
    """The keywords a launch over t adds: none when PDL is off (the launch as before), else the kernel's `PDL`
    constexpr (1: trigger at the start, 2: past the wait; mode 3 gives 2 to a `late` launch, 1 to the others),
    Triton's `launch_pdl` and the given constexprs (a kernel's loads to issue before its wait)."""
    m = mode_for(t)
    if not m:
        return {}
    return {"PDL": (2 if late else 1) if m == 3 else m, "launch_pdl": True, **early}


def weights_settled(w: torch.Tensor, fresh: bool) -> bool:
    """Whether a launch may read weights w before its wait: yes unless a kernel queued just now made them (`fresh`:
    a router converted on first use). On a GPU with PDL on, a fresh tensor is waited for once from the host (outside
    a capture), so that the eager first step and the captured ones launch the same build (none compiles while a
    graph records); on the CPU the conversion is done when the call returns."""
    if not (fresh and mode_for(w)) or not w.is_cuda:
        return True
    if torch.cuda.is_current_stream_capturing():
        return False
    torch.cuda.current_stream(w.device).synchronize()
    return True


def routing_ahead(t: torch.Tensor) -> bool:
    """Mode 3 over t: the experts' gate/up launch triggers late and their down kernel reads its routing early."""
    return mode_for(t) == 3


@triton.jit
def pdl_start(PDL: tl.constexpr):
    """A kernel's first line: in mode 1 the next kernel of the stream may launch now (it waits for this one before
    it reads what this one writes)."""
    if PDL == 1:
        _gdc_launch_dependents()


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Before the first read of what an earlier kernel wrote and before the first store: wait for the predecessor
    grid (and so, transitively, every earlier one) to complete; in mode 2 the next kernel may launch from here."""
    if PDL:
        _gdc_wait()
        if PDL == 2:
            _gdc_launch_dependents()
