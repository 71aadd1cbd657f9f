"""Every STRATA_* environment switch: read once, typed, documented here and in docs/SWITCHES.md.

An unset switch leaves the default path, and its output bytes, unchanged.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

from strata.errors import StrataError


@dataclass(frozen=True)
class Switch:
    name: str
    default: bool | int | float | str
    doc: str


SWITCHES: dict[str, Switch] = {s.name: s for s in [
    Switch("STRATA_PROMPT_ATTN_OLD", False, "prompt attention: the plain fp32 reference kernel instead of v2"),
    Switch("STRATA_PA_V2T", False, "prompt attention: v2 with register staging (no async copies); automatic below sm_80"),
    Switch("STRATA_PROMPT_ATTN_IMMA", False, "prompt attention: int8 x int8 tensor-core dots on the stored codes"),
    Switch("STRATA_PA_CONFIG", "", "prompt attention: v2/v2t/imma tunables as q5h6c32w4s3 (queries, heads per "
           "program, chunk, warps, stages; then optionally k2 split-K, t1 ids resolved before the launch, f1 the next "
           "chunk's rows prefetched, p16 imma's P.V in fp16, r128 a register cap, x1 codes to fp16 through their bits "
           "(x2: V before staging), g1 imma's scores per 64-dim group, n2 imma g1's q in 16 bits, d2 the fp16 P.V in "
           "two halves, e1/e2 imma g1's scales copied ahead; parts left out keep the default's)"),
    Switch("STRATA_QSA_DENSE_MASK", False, "selected attention over an fp16 KV cache (QSA, --qsa quest): SDPA with a "
           "dense [tokens, keys] mask (the previous path) instead of the selected-cells kernel"),
    Switch("STRATA_PA_MERGE_KERNEL", False, "prompt attention: merge a block's selections with two Triton passes "
           "instead of torch's sort (the same merged cells)"),
    Switch("STRATA_DECODE_ATTN_SPLITK", False, "decode attention: the split-K kernel and its merge at every span "
           "(the default takes short spans in one launch, decode_short.py)"),
    Switch("STRATA_DECODE_TURN", False, "decode steps (GPU, one row, spans the one-launch attention takes; a dense "
           "fp16/bf16 cache, or the int8 pool without a cell selection): the q/k norm + RoPE and the key/value store "
           "inside the attention's launch (kernels/attention/decode_turn.py), one launch a layer fewer; the same "
           "roundings, each row's norm summed in another order (a step of the dtype at most)"),
    Switch("STRATA_ROUTE_SEPARATE", False, "MoE layers: the residual add + norm, the router and the top-k as three "
           "launches (the default: one, kernels/pointwise/add_norm_route.py)"),
    Switch("STRATA_DECODE_CHAIN", "", "decode steps with every expert resident (GPU, one-shot formats): an MoE "
           "layer's o projection, add + norm + routing, experts and closing norm as one launch whose programs take "
           "work items in order from a counter (kernels/moe/chain_moe.py), and the captured step's q/k/v matvec "
           "with its norm + RoPE + store as another (chain_qkv_store.py); 1: the default tiles, W:G:D[:O[:R]]: warps, "
           "gate/up, down and matvec rows, router rows a routing item, ns between polls (as bench moe-chain --sweep; 0 "
           "the default's)"),
    Switch("STRATA_DP4A", False, "decode steps (GPU, bf16/fp16, 1-4 rows): the decoder's Q4_0 q/k/v and o matvecs and "
           "resident Q4_0 experts' gate/up and down through the int8-activation dp4a GEMVs (kernels/moe/dp4a_gemv.py, "
           "models/dp4a_step.py); the norms before them also write the activation's int8 codes; changes logits "
           "(~0.5 % of a row each matvec)"),
    Switch("STRATA_DP4A_SPLIT", False, "with STRATA_DP4A: the dense Q4_0 matvecs (q/k/v, o) of rows of a multiple "
           "of 256 weights read a copy of their rows re-laid for 16-byte code loads (kernels/quant/q4_0_split.py), "
           "made at the first decode step; costs those weights' bytes again in VRAM (A3B: 0.5 GB; counted by the "
           "placement plan)"),
    Switch("STRATA_DP4A_PARTS", "", "with STRATA_DP4A: the matvecs it takes, a comma list of qkv, o and experts "
           "(unset: all three); the others keep the float kernels (for arms of one package: session 18's increments "
           "found only q/k/v faster under it)"),
    Switch("STRATA_PREFILL_MMQ", True, "prompt experts: 0 selects the fp16/bf16 dequantize-then-GEMM path"),
    Switch("STRATA_PF_FUSED", False, "prompt experts: fused int8 gate/up+SwiGLU and down kernels"),
    Switch("STRATA_PF_STREAM_COPIES", False, "prompt streaming: three host-to-device copies an expert (the previous "
           "form, for before/after runs) instead of one gather launch a layer reading the pinned host stacks"),
    Switch("STRATA_PF_STREAM", "", "prompt streaming: how a layer's missing experts reach the device: dma (the "
           "default: the copy engines, few strided cudaMemcpy2DAsync calls a batch, no SM), gather (one kernel "
           "reading the pinned stacks), gather-hi (that kernel on a copy stream of the highest priority), dma1d "
           "(the copy engines, one copy an expert part)"),
    Switch("STRATA_PF_EARLY", True, "prompt streaming: the next layer's experts queued for copy before this layer's "
           "routing is read (where the ring holds two layers), not after its experts are launched; its late misses "
           "on a second copy stream (0: after the launch, as before session 10)"),
    Switch("STRATA_CHECKPOINT_AHEAD", False, "streamed prompts of a hybrid model: the host memory of the checkpoint "
           "saved at the prompt's end pinned in the host's routing waits during the prompt (engine/idle_work.py) "
           "instead of by the save after the last layer (on the H200 the pinning took 3x longer there and overran "
           "the waits: no faster at 4K, slower at 32K)"),
    Switch("STRATA_PF_GATHER", "", "prompt streaming: the gather kernel's launch as p66b2048w4, the default "
           "(persistent programs, 8-byte words a program copies per step, warps; parts left out keep the default's)"),
    Switch("STRATA_CPU_POOL_INT8", False, "CPU expert pool: int8 activation codes in the SIMD kernels (faster, ~258x looser)"),
    Switch("STRATA_CPU_POOL_OLD", False, "CPU expert pool: the numba `blocks` kernels (int16, per-row sums) for parity"),
    Switch("STRATA_GEMV_STREAM", 0, "decode GEMVs (experts, dense matvec): the streamed kernels on the default tiles, "
           "persistent programs of N warps an SM in all, -1 as many as stay resident (Q2_0/Q4_0/Q8_0/Q4_K, on a "
           "GPU); 0: the default kernels"),
    Switch("STRATA_GEMV_ONESHOT", False, "decode GEMVs (experts, dense matvec): the one-shot kernels (every weight of "
           "a program's rows loaded at once) on their reasoned tiles (Q2_0/Q4_0/Q8_0/Q4_K, on a GPU)"),
    Switch("STRATA_ADAPT_SYNC", False, "direct misses: the cache's counts read with a host wait when an adapt period "
           "ends, and the swaps made at once (the previous schedule, for before/after runs)"),
    Switch("STRATA_MISSES_SERIAL", False, "direct misses: the misses' GEMVs after the hits' on one stream (the "
           "previous order, for before/after runs) instead of beside them on a second stream"),
    Switch("STRATA_MISSES_COPY", False, "direct misses: each layer's missed experts copied from pinned host RAM into "
           "device scratch by one gather launch (16-byte loads), then the hits' GEMVs over it, instead of the GEMVs "
           "reading host RAM in place; the same bytes"),
    Switch("STRATA_MISSES_SKIP", False, "direct misses, captured decode: each layer's misses' launches inside a "
           "conditional graph node taken only when a routed expert is missing (one flag launch a layer)"),
    Switch("STRATA_SPEC_PIPELINE", False, "speculation: greedy MTP drafts go into the verify window on the device, one "
           "host read a window (the H200 failed to capture 2/4-row windows this way in session 5)"),
    Switch("STRATA_HC_FP32", False, "qwen4exp prompts on a GPU: the hyper-connection read's GEMMs in float32 "
           "instead of TF32 (for before/after runs and parity)"),
    Switch("STRATA_HC_TORCH", False, "qwen4exp: the hyper-connection reads and writes through torch (~25 launches a "
           "read) instead of kernels/hc (3 launches on 1-4 rows; a prompt's elementwise work), for before/after runs"),
    Switch("STRATA_NGRAM_SYNC", False, "qwen4exp prompts: each chunk's n-gram rows looked up in line (distinct rows "
           "dequantized by torch, pageable copy; the previous form, for before/after runs) instead of ahead on a host "
           "thread into pinned memory; the same rows"),
    # On by default from session 8's H200 sweep: the A3B step 2.11 -> 1.95 ms all resident, 3.11 -> 2.56 ms at 12
    # GiB, the same tokens and logits bytes in every mode (kernels/pdl.py; CPU launches never take it).
    Switch("STRATA_PDL", 1, "decode step kernels (sm_90+): programmatic dependent launch, each kernel's programs "
           "launched while its predecessor finishes (weights loaded before the wait); 1 (default): the next kernel "
           "may launch at a kernel's start, 2: only once past its wait, 3: as 1 but the experts' down kernel also "
           "streams its weights before its wait (its routing complete at launch); 0: off (kernels/pdl.py)"),
    Switch("STRATA_DECODE_AHEAD", 1, "decode without a repetition penalty (every step on the device): each step "
           "queued before the host reads the previous step's token, chosen on the device (engine/decode_ahead.py); "
           "the same tokens; 1 (default): captured steps, 2: the uncaptured static step too, 0: off"),
    Switch("STRATA_NO_GRAPHS", False, "decode: step by step instead of captured CUDA graphs (for comparison)"),
    Switch("STRATA_LOGPOS", "", "quality: append a record per position scored by the decode loop to this file (TSV)"),
    Switch("STRATA_LOGPOS_TOPK", 20, "quality: the `id:logprob` pairs per STRATA_LOGPOS record (0 to 256)"),
]}

_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}
_values: dict[str, bool | int | float | str] = {}


def _parse(switch: Switch, text: str):
    kind = type(switch.default)
    try:
        if kind is bool:
            lowered = text.strip().lower()
            if lowered not in _TRUE | _FALSE:
                raise ValueError(text)
            return lowered in _TRUE
        return kind(text)
    except ValueError:
        raise StrataError(f"environment switch {switch.name}={text!r} is not a valid {kind.__name__}") from None


def check(name: str, text: str) -> None:
    """A STRATA_ setting given as text (a comparison's configuration): a declared switch and a value of its kind,
    else a one-line error (a misspelt name would otherwise run the defaults under another label)."""
    if name not in SWITCHES:
        raise StrataError(f"{name} is not a Strata switch (strata/switches.py declares them)")
    _parse(SWITCHES[name], text)


def unknown_in_environment() -> list[str]:
    """STRATA_ names in the environment that no switch declares (a misspelt switch is otherwise ignored unsaid)."""
    return sorted(name for name in os.environ if name.startswith("STRATA_") and name not in SWITCHES)


def get(name: str):
    """The switch's value: from the environment the first time it is asked for, then fixed for the process."""
    if name not in SWITCHES:
        raise KeyError(f"{name} is not a declared switch; add it to strata/switches.py")
    if name not in _values:
        text = os.environ.get(name)
        _values[name] = SWITCHES[name].default if text is None else _parse(SWITCHES[name], text)
    return _values[name]


@contextmanager
def override(**values):
    """Tests: set switches for a block (`with override(STRATA_PF_FUSED=True): ...`)."""
    for name in values:
        get(name)  # checks the name and fixes the current value so it can be restored
    saved = {name: _values[name] for name in values}
    _values.update(values)
    try:
        yield
    finally:
        _values.update(saved)
