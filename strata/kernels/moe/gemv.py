"""The routed experts of a decode step (T = 1..8 tokens, top-k each) in two launches that never wait on the host.

`moe_gemv(x, topk_ids, topk_weights, experts)`:
  1. `_gate_up_kernel`: a program per (token, chosen expert) pair and BN features decodes the gate and up rows in
     registers (`decode.decode32`), multiplies them with x in float32 and applies SwiGLU: H float32 [T, k, ff].
  2. `_down_kernel`: a program per token and BN outputs runs the down rows of all k chosen experts against their H
     rows, weighted by topk_weights, and sums over k in registers in a fixed order (no atomics: deterministic).

The weights are read where the engine keeps them (`DecodeExperts`): the stacked GGUF tensors, or the expert cache's
slots with a device table expert -> slot, a slot < 0 meaning "not resident" (the pair contributes exactly zero; the
CPU pool computes it). The expert ids are read on the device, so both launches capture in a CUDA graph and replay
with new ids.

A program's tile is BN rows x NS consecutive blocks: decode32 decodes 32 weights of each of the BN*NS (row, block)
pairs at once ("virtual rows"), reshaped to [BN, NS, 32] against the activations' [NS, 32] slice, so each step
reads NS blocks of every row (NS*18 contiguous bytes of Q4_0) and the accumulators are only reduced at the end.
Q2_0, Q4_0, Q8_0, Q4_K and the lattice i-quants IQ2_XS / IQ3_XXS / IQ3_S take the word kernels of `wide_gemv.py`
instead (same contracts, a thread per 16/32-bit word of codes; `GemvConfig.wide`); the byte-a-weight kernels here
serve the other formats (and the word formats at odd offsets).

Precision: the weights are decoded exactly (every GGUF weight is a float32, Q4_K's `d*sc*q - dmin*m` rounded once),
x is read as given and H is kept in float32, so the only error is float32 summation: at most about
depth * 2^-24 * sum|w*x| per dot, with depth ~ K/(32*NS) + 10. Measured against float64 on random blocks it is
~1e-7 of max|y|; the tests bound it by ERROR_BOUND of max|y| (and H by the same of max|H|).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from strata import switches
from strata.errors import StrataError
from strata.kernels import pdl
from strata.kernels.moe.decode import DecodeSpec, code_tables, decode32, decode_spec
from strata.kernels.moe.dispatch import use_triton
from strata.kernels.moe.oneshot_gemv import (ONESHOT_FORMATS, launch_oneshot_down, launch_oneshot_gate_up,
                                             oneshot_tile)
from strata.kernels.moe.stream_gemv import (FIT, STREAM_FORMATS, launch_stream_down, launch_stream_gate_up,
                                             stream_applies)
from strata.kernels.moe.wide_gemv import (UNIT, WORDS, cover, launch_word_down, launch_word_gate_up,
                                           word_gemv_applies, word_tile)
from strata.quant import dequantize, get_format

ERROR_BOUND = 1e-5  # max |kernel - float64| over max |float64|, for H and for the output


@dataclass(frozen=True)
class ExpertOperand:
    """One projection of the routed experts as the decode kernels read it: index i's `rows` rows of `cols` weights
    start at byte i * stride of `raw` (a uint8 tensor whose first byte is index 0's first row)."""

    raw: torch.Tensor
    qtype: int
    rows: int
    cols: int
    stride: int

    @property
    def spec(self) -> DecodeSpec:
        return decode_spec(self.qtype)

    @property
    def row_bytes(self) -> int:
        return get_format(self.qtype).row_bytes(self.cols)

    @property
    def expert_bytes(self) -> int:
        return self.rows * self.row_bytes

    def expert(self, i: int) -> torch.Tensor:
        """Index i's weights, float32 [rows, cols] (the references)."""
        flat = self.raw.reshape(-1)
        raw = flat[i * self.stride : i * self.stride + self.expert_bytes].reshape(self.rows, self.row_bytes)
        return dequantize(raw, self.qtype, (self.rows, self.cols))


def _operand(part, raw: torch.Tensor, stride: int) -> ExpertOperand:
    _, rows, cols = part.shape
    return ExpertOperand(raw, int(part.ggml_type), rows, cols, stride)


@dataclass(frozen=True)
class DecodeExperts:
    """A layer's routed experts as the decode kernels read them; `slot_of` (int32 [E] on the device, or None for
    the identity) maps an expert id to the index the operands are read at, < 0 for an expert that is not there."""

    gate: ExpertOperand
    up: ExpertOperand
    down: ExpertOperand
    slot_of: torch.Tensor | None = None
    # Most pairs absent (the direct misses' launch over the host stacks): the one-shot programs of absent pairs skip
    # their loads and dots (19 -> 5 us a layer with every expert a hit, H200). Off elsewhere, so the hits' kernels
    # compile without the branch.
    sparse: bool = False

    @classmethod
    def of_stack(cls, stack) -> "DecodeExperts":
        """From the stacked tensors (anything with .gate/.up/.down carrying .raw, .ggml_type, .shape: ExpertStack)."""
        parts = []
        for part in (stack.gate, stack.up, stack.down):
            n_experts, rows, cols = part.shape
            row_bytes = get_format(part.ggml_type).row_bytes(cols)
            if part.raw.dtype != torch.uint8 or part.raw.numel() != n_experts * rows * row_bytes:
                raise StrataError(f"expert tensor {getattr(part, 'name', '')} of shape {tuple(part.shape)} needs "
                                  f"{n_experts * rows * row_bytes} uint8 bytes, got {part.raw.numel()}")
            parts.append(_operand(part, part.raw.contiguous().reshape(-1), rows * row_bytes))
        return cls(*parts).checked()

    @classmethod
    def of_slots(cls, slots: torch.Tensor, slot_of: torch.Tensor, stack) -> "DecodeExperts":
        """From expert-cache slots: uint8 [n_slots, slot_bytes], each slot holding one expert's gate, up and down
        bytes back to back from its first byte (`ExpertCache.admit`); `stack` gives the formats and shapes."""
        flat, offset, parts = slots.reshape(-1), 0, []
        for part in (stack.gate, stack.up, stack.down):
            operand = _operand(part, flat[offset:], slots.shape[1])
            parts.append(operand)
            offset += operand.expert_bytes
        if offset > slots.shape[1]:
            raise StrataError(f"a slot of {slots.shape[1]} bytes cannot hold an expert of {offset}")
        return cls(*parts, slot_of=slot_of).checked()

    def checked(self) -> "DecodeExperts":
        g, u, d = self.gate, self.up, self.down
        if (g.qtype, g.rows, g.cols) != (u.qtype, u.rows, u.cols):
            raise StrataError("the decode expert kernels need gate and up of one format and shape")
        if (d.rows, d.cols) != (g.cols, g.rows):
            raise StrataError(f"down experts of shape {d.rows}x{d.cols} do not invert gate's {g.rows}x{g.cols}")
        for m in (g, d):
            if m.cols % m.spec.block_size or m.cols % 32:
                raise StrataError(f"{m.spec.name} rows of {m.cols} weights are not whole blocks")
        return self

    @property
    def n_embd(self) -> int:
        return self.gate.cols

    @property
    def n_ff(self) -> int:
        return self.gate.rows

    def index_of(self, topk_ids: torch.Tensor) -> torch.Tensor:
        """The operand index of each chosen expert (the slot table applied), int64."""
        ids = topk_ids.long()
        return ids if self.slot_of is None else self.slot_of.to(ids.device).long()[ids]


# ---------------------------------------------------------------------------------------------------- kernels


@triton.jit
def _weights(q, s_lo, s_hi, mn, SPLIT16: tl.constexpr, HAS_MIN: tl.constexpr):
    """decode32's codes and scales as the float32 weights [R, 32]."""
    if SPLIT16:
        first = tl.arange(0, 32)[None, :] < 16
        w = q.to(tl.float32) * tl.where(first, s_lo[:, None], s_hi[:, None])
    else:
        w = q.to(tl.float32) * s_lo[:, None]
    if HAS_MIN:
        w = w + mn[:, None]
    return w


@triton.jit
def _gate_up_kernel(x, ids, slot_of, wg, wu, tab, h, n_ff, stride_g, stride_u, row_bytes,
                    TOP_K: tl.constexpr, K: tl.constexpr, NB: tl.constexpr, FMT: tl.constexpr, QK: tl.constexpr,
                    TS: tl.constexpr, SPLIT16: tl.constexpr, HAS_MIN: tl.constexpr, SLOTS: tl.constexpr,
                    BN: tl.constexpr, NS: tl.constexpr):
    pair = tl.program_id(0)
    token = pair // TOP_K
    index = tl.load(ids + pair).to(tl.int32)
    if SLOTS:
        index = tl.load(slot_of + index).to(tl.int32)
    r = tl.arange(0, BN * NS)  # virtual rows: feature r // NS, block r % NS of the step
    f = tl.program_id(1) * BN + r // NS
    b = r % NS
    live = (f < n_ff) & (index >= 0)
    expert = tl.maximum(index, 0).to(tl.int64)
    g_at = wg + expert * stride_g
    u_at = wu + expert * stride_u
    row_at = f * row_bytes + b * TS
    nb = tl.arange(0, NS)
    j = tl.arange(0, 32)
    x_row = x + token.to(tl.int64) * K
    acc_g = tl.zeros((BN, NS, 32), tl.float32)
    acc_u = tl.zeros((BN, NS, 32), tl.float32)
    for k0 in range(0, NB, NS):
        m = live & (k0 + b < NB)
        xm = (k0 + nb < NB)[:, None]
        for sub in range(QK // 32):
            xv = tl.load(x_row + (k0 + nb)[:, None] * QK + sub * 32 + j[None, :], mask=xm, other=0.0)
            xv = xv.to(tl.float32)[None, :, :]
            q, s_lo, s_hi, mn = decode32(FMT, g_at, row_at + k0 * TS, sub, tab, m)
            acc_g += tl.reshape(_weights(q, s_lo, s_hi, mn, SPLIT16, HAS_MIN), (BN, NS, 32)) * xv
            q, s_lo, s_hi, mn = decode32(FMT, u_at, row_at + k0 * TS, sub, tab, m)
            acc_u += tl.reshape(_weights(q, s_lo, s_hi, mn, SPLIT16, HAS_MIN), (BN, NS, 32)) * xv
    g = tl.sum(tl.sum(acc_g, axis=2), axis=1)
    u = tl.sum(tl.sum(acc_u, axis=2), axis=1)
    fo = tl.program_id(1) * BN + tl.arange(0, BN)
    tl.store(h + pair.to(tl.int64) * n_ff + fo, g / (1.0 + tl.exp(-g)) * u, mask=fo < n_ff)


@triton.jit
def _down_kernel(h, ids, topk_w, slot_of, wd, tab, y, n_embd, stride_d, row_bytes,
                 TOP_K: tl.constexpr, K: tl.constexpr, NB: tl.constexpr, FMT: tl.constexpr, QK: tl.constexpr,
                 TS: tl.constexpr, SPLIT16: tl.constexpr, HAS_MIN: tl.constexpr, SLOTS: tl.constexpr,
                 KC: tl.constexpr, BN: tl.constexpr, NS: tl.constexpr):
    token = tl.program_id(0)
    r = tl.arange(0, KC * BN * NS)  # virtual rows: expert r // (BN*NS) of the chunk, output (r // NS) % BN, block r%NS
    c = r // (BN * NS)
    o = tl.program_id(1) * BN + (r // NS) % BN
    b = r % NS
    row_at = o * row_bytes + b * TS
    cj = tl.arange(0, KC)
    nb = tl.arange(0, NS)
    j = tl.arange(0, 32)
    acc = tl.zeros((KC, BN, NS, 32), tl.float32)
    for j0 in range(0, TOP_K, KC):  # KC experts at a time, in order
        pm = j0 + c < TOP_K
        index = tl.load(ids + token * TOP_K + j0 + c, mask=pm, other=0).to(tl.int32)
        if SLOTS:
            index = tl.load(slot_of + index, mask=pm, other=-1).to(tl.int32)
        live = pm & (index >= 0) & (o < n_embd)
        w_at = tl.maximum(index, 0).to(tl.int64) * stride_d + row_at
        cm = j0 + cj < TOP_K
        weight = tl.load(topk_w + token * TOP_K + j0 + cj, mask=cm, other=0.0).to(tl.float32)
        h_rows = h + (token * TOP_K + j0 + cj).to(tl.int64) * K
        for k0 in range(0, NB, NS):
            m = live & (k0 + b < NB)
            hm = cm[:, None, None] & (k0 + nb < NB)[None, :, None]
            for sub in range(QK // 32):
                hv = tl.load(h_rows[:, None, None] + (k0 + nb)[None, :, None] * QK + sub * 32 + j[None, None, :],
                             mask=hm, other=0.0)
                hv = (hv * weight[:, None, None])[:, None, :, :]
                q, s_lo, s_hi, mn = decode32(FMT, wd, w_at + k0 * TS, sub, tab, m)
                acc += tl.reshape(_weights(q, s_lo, s_hi, mn, SPLIT16, HAS_MIN), (KC, BN, NS, 32)) * hv
    out = tl.sum(tl.sum(tl.sum(acc, axis=3), axis=2), axis=0)
    oo = tl.program_id(1) * BN + tl.arange(0, BN)
    tl.store(y + token.to(tl.int64) * n_embd + oo, out, mask=oo < n_embd)


# ---------------------------------------------------------------------------------------------------- launches


# Tiles the H200 sweep measured faster than word_tile's reasoned ones (`bench moe-decode --sweep`, session 4's middle
# call, commit 31c71d1): gate_up Q4_K 1.28x, Q4_0 1.23x, Q2_0 1.17x; down Q4_K 1.21x. (ns: at most, unless the entry
# sets `stream`, e.g. dict(bn=4, ns=32, warps=8, stream=-1) from a `--sweep stream` line: then the tile as given.)
MEASURED_TILES = {  # H200 sweeps (session 6, `--sweep oneshot`): one-shot tiles, else session 5's streamed ones
    ("gate_up", "Q4_0"): dict(oneshot=True, bn=8, warps=4, split=1),  # stream 13.47 -> 9.58 us (A3B shape)
    ("down", "Q4_0"): dict(oneshot=True, bn=8, warps=16, split=1),  # words 9.40 -> 6.77 us
    ("gate_up", "Q4_K"): dict(bn=4, ns=16, warps=2, stream=-1),  # 13.16 -> 11.69 us (one-shot not yet measured)
    ("gate_up", "Q2_0"): dict(oneshot=True, bn=4, warps=4, split=1),  # stream 12.73 -> 11.68 us (qwen4exp shape)
    ("down", "Q4_K"): dict(bn=16, ns=32, warps=8, stream=-1),  # 8.69 -> 7.01 us
    ("down", "Q2_0"): dict(oneshot=True, bn=8, warps=8, split=2),  # stream 9.78 -> 7.81 us
    # the dense matvec: the reasoned one-shot tile was the best line at 2048x5120 (8.10 -> 5.66 us), 4096x2048
    # (6.59 -> 5.00) and 2560x10240 Q2_0 (15.38 -> 9.46)
    ("matvec", "Q4_0"): dict(oneshot=True),
    ("matvec", "Q2_0"): dict(oneshot=True),
    ("matvec", "Q8_0"): dict(oneshot=True),  # by analogy (the same kernel family): timed end to end only
}


@dataclass(frozen=True)
class GemvConfig:
    """A program's tile: BN output rows x NS blocks per step (x KC experts at once in the down kernel), warps;
    `wide`: the word kernels (`wide_gemv.py`: NS counts their units) where the format and alignment allow, the
    input then cut in `split` slices (a program each, summed in order by a second launch); `stream` != 0: the
    streamed word kernels (`stream_gemv.py`: that many persistent programs an SM, or with -1 as many as stay
    resident, the next step loaded ahead; Q2_0 / Q4_0 / Q8_0 / Q4_K, `split` then unused) where the format
    allows, else the word kernels; `oneshot`: the one-shot kernels (`oneshot_gemv.py`: BN rows a program, every
    unit of its slice of the input loaded at once, `split` slices; NS unused) where the format allows."""

    bn: int
    ns: int
    warps: int
    kc: int = 1
    wide: bool = False
    split: int = 1
    stream: int = 0
    oneshot: bool = False


def gemv_config(kind: str, spec: DecodeSpec, n_out: int, n_in: int, top_k: int, on_gpu: bool) -> GemvConfig:
    """The launch configuration of "gate_up", "down" or "matvec" (the dense matvec: the down kernel with one
    "expert") for n_out rows of n_in weights.

    Q2_0, Q4_0, Q8_0, Q4_K, IQ2_XS, IQ3_XXS, IQ3_S: the word kernels' tiles (`wide_gemv.word_tile`; the down
    kernel's units run over all chosen experts at once). The other formats, byte kernels:

    On a GPU: a step reads about 512 (gate/up) or 256 (down) weights of each row, 8 (gate/up) or 2 (down) rows per
    program, KC = up to 8 experts at once (down), and warps so that each thread holds 16 decoded weights (4 for the
    256-weight formats, whose decode needs more registers): 60-180 registers, none spilled (sm_90 builds, tested).
    Under the interpreter, whose cost is per operation: the widest tiles. (The dense matvec takes gate_up's byte
    tiles: with one "expert" the down kernel's own would leave most of a program idle.)
    """
    if spec.name in WORDS:
        n_units = n_in // UNIT[spec.name] * (top_k if kind == "down" else 1)
        bn, nu, warps, split = word_tile(spec, n_out, n_units, on_gpu, top_k if kind == "gate_up" else 1)
        cfg = GemvConfig(bn, nu, warps, 1, True, split)
        measured = MEASURED_TILES.get((kind, spec.name)) if on_gpu else None
        if on_gpu and spec.name in ONESHOT_FORMATS and switches.get("STRATA_GEMV_ONESHOT"):
            return oneshot_config(kind, spec, n_out, n_in, top_k, on_gpu)
        if measured and measured.get("oneshot"):  # a one-shot sweep line copied whole: its rows, warps, split
            return replace(oneshot_config(kind, spec, n_out, n_in, top_k, on_gpu), **measured)
        if measured:  # ns at most word_tile's; a streamed tile's (a sweep line copied whole) as measured
            ns = measured.get("ns", nu)
            cfg = replace(cfg, **{**measured, "ns": ns if measured.get("stream") else min(nu, ns)})
        warps_an_sm = switches.get("STRATA_GEMV_STREAM") if on_gpu else 0
        if warps_an_sm and spec.name in STREAM_FORMATS:  # < 0: as many programs as stay resident
            cfg = replace(cfg, stream=FIT if warps_an_sm < 0 else max(1, warps_an_sm // cfg.warps))
        return cfg
    return byte_config(kind, spec, n_out, n_in, top_k, on_gpu)


def oneshot_config(kind: str, spec: DecodeSpec, n_out: int, n_in: int, top_k: int, on_gpu: bool) -> GemvConfig:
    """The one-shot kernels' reasoned tile (`oneshot_gemv.oneshot_tile`) for "gate_up", "down" or "matvec"."""
    n_units = n_in // UNIT[spec.name] * (top_k if kind == "down" else 1)
    programs, operands = (top_k, 2) if kind == "gate_up" else (1, 1)
    bn, warps, split = oneshot_tile(spec, n_out, n_units, programs, operands, on_gpu)
    nu = word_tile(spec, n_out, n_units, on_gpu, programs)[1]  # the word kernels' step, where operands do not fit
    return GemvConfig(bn, nu, warps, 1, True, split, 0, True)


def byte_config(kind: str, spec: DecodeSpec, n_out: int, n_in: int, top_k: int, on_gpu: bool) -> GemvConfig:
    """`gemv_config` for the byte kernels of this file (any format; the word formats when misaligned)."""
    if kind == "matvec":
        kind, top_k = "gate_up", 1
    n_blocks = n_in // spec.block_size
    if not on_gpu:
        ns = 1 << (n_blocks - 1).bit_length() if n_blocks <= 8 else 8
        kc = min(8, 1 << (top_k - 1).bit_length()) if kind == "down" else 1
        return GemvConfig(min(256, 1 << (n_out - 1).bit_length()), ns, 4, kc)
    if kind == "gate_up":
        bn, ns, kc = 8, cover(n_blocks, max(1, 512 // spec.block_size)), 1
    else:
        bn, ns, kc = 2, cover(n_blocks, max(1, 256 // spec.block_size)), cover(top_k, 8)
    per_thread = 16 if spec.block_size <= 64 else 4
    # At least 4 warps for the 256-weight formats: IQ2_XS's down tile on 2 warps puts 8 bytes on the stack once
    # the launch's 16-byte alignments are known (sm_90 build, tests/kernels/moe/test_gemv.py).
    fewest = 1 if spec.block_size <= 64 else 4
    return GemvConfig(bn, ns, max(fewest, min(8, kc * bn * ns // per_thread)), kc)


def _format_constants(m: ExpertOperand) -> dict:
    spec = m.spec
    return dict(K=m.cols, NB=m.cols // spec.block_size, FMT=spec.fmt_id, QK=spec.block_size, TS=spec.type_size,
                SPLIT16=spec.split16, HAS_MIN=spec.has_min)


def _takes_words(cfg: GemvConfig, *operands: ExpertOperand) -> bool:
    """Whether a launch of cfg takes the word kernels: asked for, and every operand aligned for their loads."""
    return cfg.wide and all(word_gemv_applies(m.spec, m.raw.data_ptr(), m.stride, m.row_bytes) for m in operands)


def _takes_oneshot(cfg: GemvConfig, *operands: ExpertOperand) -> bool:
    """Whether a launch of cfg takes the one-shot kernels: asked for, the format and alignment fit (as streamed)."""
    return cfg.wide and cfg.oneshot and all(
        m.spec.name in ONESHOT_FORMATS and stream_applies(m.spec, m.rows, m.row_bytes, m.raw.data_ptr(), m.stride)
        for m in operands)


def _takes_stream(cfg: GemvConfig, *operands: ExpertOperand) -> bool:
    """Whether a launch of cfg takes the streamed word kernels: asked for, and the format and alignment fit."""
    return cfg.wide and cfg.stream != 0 and all(stream_applies(m.spec, m.rows, m.row_bytes, m.raw.data_ptr(), m.stride)
                                               for m in operands)


def _check_routing(x: torch.Tensor, topk_ids: torch.Tensor, experts: DecodeExperts) -> None:
    if x.dim() != 2 or x.shape[1] != experts.n_embd:
        raise StrataError(f"x of shape {tuple(x.shape)} does not match experts of {experts.n_embd} inputs")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]:
        raise StrataError(f"topk_ids of shape {tuple(topk_ids.shape)} do not route {x.shape[0]} tokens")


def gate_up_swiglu_triton(x: torch.Tensor, topk_ids: torch.Tensor, experts: DecodeExperts,
                          config: GemvConfig | None = None, pdl_late: bool = False) -> torch.Tensor:
    """H = silu(x Wg^T) * (x Wu^T) of every (token, chosen expert) pair: float32 [T, k, ff]. `pdl_late`
    (STRATA_PDL=3, kernels/pdl.py): the one-shot launch lets the next kernel launch only past its wait."""
    _check_routing(x, topk_ids, experts)
    n_tokens, top_k = topk_ids.shape
    g, u = experts.gate, experts.up
    h = torch.empty(n_tokens, top_k, g.rows, dtype=torch.float32, device=x.device)
    cfg = config or gemv_config("gate_up", g.spec, g.rows, g.cols, top_k, x.is_cuda)
    slots = experts.slot_of is not None
    if cfg.wide and not _takes_words(cfg, g, u):  # operands at odd offsets: the byte kernel's own tiles
        cfg = byte_config("gate_up", g.spec, g.rows, g.cols, top_k, x.is_cuda)
    if h.numel() and _takes_oneshot(cfg, g, u):
        launch_oneshot_gate_up(x, topk_ids, g, u, experts.slot_of, h, g.spec, cfg.bn, cfg.warps, cfg.split,
                               skip_absent=experts.sparse, late=pdl_late)
    elif h.numel() and _takes_stream(cfg, g, u):
        launch_stream_gate_up(x, topk_ids, g, u, experts.slot_of, h, g.spec, cfg.bn, cfg.ns, cfg.warps, cfg.stream)
    elif h.numel() and _takes_words(cfg, g, u):
        launch_word_gate_up(x, topk_ids, g, u, experts.slot_of, h, g.spec, cfg.bn, cfg.ns, cfg.warps, cfg.split)
    elif h.numel():
        _gate_up_kernel[(n_tokens * top_k, triton.cdiv(g.rows, cfg.bn))](
            x.contiguous(), topk_ids.contiguous(), experts.slot_of if slots else topk_ids, g.raw, u.raw,
            code_tables(x.device), h, g.rows, g.stride, u.stride, g.row_bytes, TOP_K=top_k, **_format_constants(g),
            SLOTS=slots, BN=cfg.bn, NS=cfg.ns, num_warps=cfg.warps)
    return h


def down_sum_triton(h: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, experts: DecodeExperts,
                    out_dtype: torch.dtype = torch.float32, config: GemvConfig | None = None,
                    routing_ahead: bool = False) -> torch.Tensor:
    """y[t] = sum_j topk_weights[t, j] * (Wd of expert topk_ids[t, j]) h[t, j]: [T, embd], summed in order of j.
    `routing_ahead` (STRATA_PDL=3, right after a `pdl_late` gate/up call): the routing read before the wait."""
    d = experts.down
    cfg = config or gemv_config("down", d.spec, d.rows, d.cols, topk_ids.shape[1], h.is_cuda)
    return launch_down(h, topk_ids, topk_weights, d, experts.slot_of, out_dtype, cfg, skip_absent=experts.sparse,
                       routing_ahead=routing_ahead)


def launch_down(h: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, d: ExpertOperand,
                slot_of: torch.Tensor | None, out_dtype: torch.dtype, cfg: GemvConfig,
                skip_absent: bool = False, routing_ahead: bool = False) -> torch.Tensor:
    """The down kernel over operand d: y [T, d.rows] (also the dense matvec of kernels/quant: one "expert")."""
    n_tokens, top_k = topk_ids.shape
    y = torch.empty(n_tokens, d.rows, dtype=out_dtype, device=h.device)
    slots = slot_of is not None
    if cfg.wide and not _takes_words(cfg, d):
        cfg = byte_config("down" if top_k > 1 else "matvec", d.spec, d.rows, d.cols, top_k, h.is_cuda)
    if y.numel() and _takes_oneshot(cfg, d):
        launch_oneshot_down(h, topk_ids, topk_weights, d, slot_of, y, d.spec, cfg.bn, cfg.warps, cfg.split,
                            skip_absent=skip_absent, routing_ahead=routing_ahead)
    elif y.numel() and _takes_stream(cfg, d):
        launch_stream_down(h, topk_ids, topk_weights, d, slot_of, y, d.spec, cfg.bn, cfg.ns, cfg.warps, cfg.stream)
    elif y.numel() and _takes_words(cfg, d):
        launch_word_down(h, topk_ids, topk_weights, d, slot_of, y, d.spec, cfg.bn, cfg.ns, cfg.warps, cfg.split)
    elif y.numel():
        _down_kernel[(n_tokens, triton.cdiv(d.rows, cfg.bn))](
            h, topk_ids.contiguous(), topk_weights.contiguous(), slot_of if slots else topk_ids, d.raw,
            code_tables(h.device), y, d.rows, d.stride, d.row_bytes, TOP_K=top_k, **_format_constants(d),
            SLOTS=slots, KC=cfg.kc, BN=cfg.bn, NS=cfg.ns, num_warps=cfg.warps)
    return y


def moe_gemv_triton(x, topk_ids, topk_weights, experts: DecodeExperts, out_dtype=None, configs=(None, None)):
    ahead = pdl.routing_ahead(x)  # STRATA_PDL=3: the down kernel reads the routing and its weights before its wait
    h = gate_up_swiglu_triton(x, topk_ids, experts, configs[0], pdl_late=ahead)
    return down_sum_triton(h, topk_ids, topk_weights, experts, out_dtype or x.dtype, configs[1], routing_ahead=ahead)


def moe_gemv(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, experts: DecodeExperts,
             out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t]) for a decode step: x [T, embd] (bf16/fp16/fp32),
    topk_ids [T, k] (int32 or int64, on x's device), topk_weights [T, k] -> [T, embd] of out_dtype (x's dtype)."""
    fn = moe_gemv_triton if use_triton(x) else moe_gemv_ref
    return fn(x, topk_ids, topk_weights, experts, out_dtype)


# ---------------------------------------------------------------------------------------------------- references


def gate_up_swiglu_ref(x, topk_ids, experts: DecodeExperts, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """H [T, k, ff] in `dtype` (float64: the definition), each expert's weights dequantized once."""
    index = experts.index_of(topk_ids)
    h = torch.zeros(*index.shape, experts.n_ff, dtype=dtype, device=x.device)
    for i in index.unique().tolist():
        if i < 0:
            continue
        token, slot = (index == i).nonzero(as_tuple=True)
        a = x[token].to(dtype)
        gate, up = (m.expert(i).to(x.device, dtype) for m in (experts.gate, experts.up))
        h[token, slot] = F.silu(a @ gate.T) * (a @ up.T)
    return h


def down_sum_ref(h, topk_ids, topk_weights, experts: DecodeExperts, dtype: torch.dtype = torch.float32):
    """[T, embd] in `dtype` from H [T, k, ff]."""
    index = experts.index_of(topk_ids)
    y = torch.zeros(index.shape[0], experts.n_embd, dtype=dtype, device=h.device)
    for i in index.unique().tolist():
        if i < 0:
            continue
        token, slot = (index == i).nonzero(as_tuple=True)
        down = experts.down.expert(i).to(h.device, dtype)
        y.index_add_(0, token, (h[token, slot].to(dtype) @ down.T) * topk_weights[token, slot, None].to(dtype))
    return y


def moe_gemv_ref(x, topk_ids, topk_weights, experts: DecodeExperts, out_dtype=None) -> torch.Tensor:
    """The torch reference (the CPU path): float32 matmuls on the dequantized weights."""
    h = gate_up_swiglu_ref(x, topk_ids, experts)
    return down_sum_ref(h, topk_ids, topk_weights, experts).to(out_dtype or x.dtype)


def moe_gemv_float64(x, topk_ids, topk_weights, experts: DecodeExperts) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition the kernels are measured against: (H, y) in float64 on the dequantized weights."""
    h = gate_up_swiglu_ref(x, topk_ids, experts, torch.float64)
    return h, down_sum_ref(h, topk_ids, topk_weights, experts, torch.float64)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want| (0 when both are zero)."""
    scale = want.double().abs().max().item()
    diff = (got.double().cpu() - want.double().cpu()).abs().max().item()
    return diff / scale if scale else diff
