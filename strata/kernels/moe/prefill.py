"""The routed experts of a prompt chunk: `moe_prefill`, which picks one of three paths by switch.

- "dense" (STRATA_PREFILL_MMQ=0): fp16 grouped GEMMs on weights decoded per tile; SwiGLU in float32 between them.
- "mmq" (the default; llama.cpp's MMQ counterpart): the tokens' activations rounded to int8 per 32 values, int8
  grouped GEMMs for gate and up, SwiGLU in float32, H rounded to int8 per 32 features, an int8 GEMM for down.
- "fused" (STRATA_PF_FUSED=1): the same roundings, but one kernel does gate, up, SwiGLU and H's rounding, and the
  Q2_0 down projection shares each block's scale between its two halves.

Both int8 paths round x once per token (llama.cpp rounds per routed row: the same values). All three group the
chunk's (token, expert) pairs on the GPU (`grouping`) and end with the weighted top-k combine.
On CUDA tensors the Triton kernels run; elsewhere each step's torch reference does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from strata import switches
from strata.errors import StrataError
from strata.kernels.moe import combine, dense, fused, grouping, mmq, quantize32
from strata.kernels.moe.dispatch import use_triton
from strata.kernels.moe.quantize32 import rounded_rows_buffers
from strata.kernels.moe.stack import MEASURED_Q2_0, ExpertMatrix, Tiles, tile_config
from strata.kernels.work_arena import AllocatorScratch, aligned_bytes

PATHS = ("dense", "mmq", "fused")


def prompt_expert_path() -> str:
    """The path the switches pick. STRATA_PREFILL_MMQ=0 (the float reference path) wins over STRATA_PF_FUSED=1."""
    if not switches.get("STRATA_PREFILL_MMQ"):
        return "dense"
    return "fused" if switches.get("STRATA_PF_FUSED") else "mmq"


@dataclass(frozen=True)
class PromptExperts:
    """A layer's routed experts as the prompt kernels read them: gate/up [E, ff, embd], down [E, embd, ff]."""

    gate: ExpertMatrix
    up: ExpertMatrix
    down: ExpertMatrix

    @classmethod
    def of(cls, stack) -> "PromptExperts":
        """From anything with .gate/.up/.down carrying .raw, .ggml_type, .shape (the engine's ExpertStack)."""
        if isinstance(stack, cls):
            return stack
        experts = cls(ExpertMatrix.of(stack.gate), ExpertMatrix.of(stack.up), ExpertMatrix.of(stack.down))
        g, u, d = experts.gate, experts.up, experts.down
        if not (g.n_experts == u.n_experts == d.n_experts and (g.rows, g.cols) == (u.rows, u.cols) == (d.cols, d.rows)):
            raise StrataError("gate/up must be [E, ff, embd] and down [E, embd, ff] with the same E, ff, embd")
        return experts

    @classmethod
    def over_slots(cls, slots: torch.Tensor, stack) -> "PromptExperts":
        """Views of expert-cache slots (uint8 [n_slots, slot_bytes], each holding one expert's gate, up and down bytes
        back to back, `ExpertCache.admit`) read as [n_slots, rows, row_bytes] matrices strided by the slot size."""
        matrices, offset = [], 0
        for m in (stack.gate, stack.up, stack.down):
            m = m if isinstance(m, ExpertMatrix) else ExpertMatrix.of(m)
            if offset + m.expert_bytes > slots.shape[1]:
                raise StrataError(f"a slot of {slots.shape[1]} bytes cannot hold an expert of this layer")
            raw = slots.as_strided((slots.shape[0], m.rows, m.row_bytes), (slots.stride(0), m.row_bytes, 1),
                                   slots.storage_offset() + offset)
            matrices.append(ExpertMatrix(raw, m.qtype, m.rows, m.cols))
            offset += m.expert_bytes
        return cls(*matrices)

    def gathered(self, index: torch.Tensor) -> "PromptExperts":
        """Stacked copies of the experts at `index` (the references read experts by position)."""
        index = index.long().clamp(min=0)
        return PromptExperts(*(ExpertMatrix(m.raw[index], m.qtype, m.rows, m.cols)
                               for m in (self.gate, self.up, self.down)))

    @property
    def n_experts(self) -> int:
        return self.gate.n_experts


def _ops(triton: bool):
    """The steps of every path, as kernels (triton) or torch references."""
    pick = (lambda m, name: getattr(m, f"{name}_triton")) if triton else (lambda m, name: getattr(m, f"{name}_ref"))
    return {
        "group": pick(grouping, "group_pairs"),
        "quantize": pick(quantize32, "quantize_rows"),
        "mm_int8": pick(mmq, "grouped_mm_int8"),
        "mm_fp16": pick(dense, "grouped_mm_fp16"),
        "gate_up": pick(fused, "gate_up_swiglu_int8"),
        "down": pick(fused, "down_int8"),
        "combine": pick(combine, "combine"),
    }


def _run(x, topk_ids, topk_weights, stack, path, triton: bool, slot_of: torch.Tensor | None = None,
         tiles: Tiles | None = None, scratch=None) -> torch.Tensor:
    path = path or prompt_expert_path()
    if path not in PATHS:
        raise StrataError(f"unknown prompt expert path {path!r} (known: {', '.join(PATHS)})")
    experts = PromptExperts.of(stack)
    op = _ops(triton)
    n_experts = experts.n_experts if slot_of is None else slot_of.numel()  # the layer's, not the slots'
    if tiles is None and path == "fused" and triton and x.is_cuda:
        tiles = small_chunk_tiles(experts, topk_ids.numel(), n_experts)
    group = op["group"](topk_ids, n_experts,
                        _group_rows(path, experts, tiles, triton and x.is_cuda))
    if slot_of is not None and triton:
        # Grouped by expert id as usual; each tile then reads its expert's weights at the expert's slot.
        tile = group.tile_expert
        group.tile_expert = torch.where(tile >= 0, slot_of.int()[tile.clamp(min=0).long()], tile)
    elif slot_of is not None:
        experts = experts.gathered(slot_of)
    n_ff, n_embd = experts.gate.rows, experts.down.rows
    scratch = scratch if scratch is not None else AllocatorScratch(x.device)
    scratch.reset()  # the previous layer's buffers are free: its kernels ran before these on the same stream
    # Every request below is listed, in the same order and size, by `prompt_work_buffers` (the chunk-size rule).

    def zeros():  # gate/up outputs feed SwiGLU row by row: padding rows must hold numbers
        return scratch.zeros((group.max_rows, n_ff), torch.float32)

    def rows_of(width, dtype=torch.float32):  # read back only at the routed pairs (combine): padding holds anything
        return scratch.empty((group.max_rows, width), dtype)

    def rounded(n_rows, k):
        return rounded_rows_buffers(scratch, n_rows, k)

    if path == "dense":
        g = op["mm_fp16"](x, group, experts.gate, True, zeros(), tiles)
        u = op["mm_fp16"](x, group, experts.up, True, zeros(), tiles)
        rows_out = op["mm_fp16"](F.silu(g, inplace=True).mul_(u), group, experts.down, False, rows_of(n_embd), tiles)
    elif path == "mmq":
        xq = op["quantize"](x, rounded(*x.shape))
        g = op["mm_int8"](*xq, group, experts.gate, True, False, zeros(), tiles)
        u = op["mm_int8"](*xq, group, experts.up, True, False, zeros(), tiles)
        h = op["quantize"](F.silu(g, inplace=True).mul_(u), rounded(group.max_rows, n_ff))
        rows_out = op["mm_int8"](*h, group, experts.down, False, False, rows_of(n_embd), tiles)
    else:
        xq = op["quantize"](x, rounded(*x.shape))
        h16 = triton and fused.fp16_h(experts.down, tiles, x.is_cuda)  # H as fp16 values for an fp16 down kernel
        h = op["gate_up"](*xq, group, experts.gate, experts.up, tiles, rounded(group.max_rows, n_ff), scratch, h16)
        rows = fused.down_rows_dtype(experts.down, tiles, x.is_cuda) if triton else torch.float32
        rows_out = op["down"](*h, group, experts.down, tiles, rows_of(n_embd, rows))
    return op["combine"](rows_out, group.pair_row, topk_weights, x.dtype)


# The fused Q2_0 kernels' shape for chunks whose experts get few rows each: the H200's sweep at 2,048 tokens (512
# experts, top 10: 40 rows an expert) timed 64-row tiles at 2.357 ms against the 128-row default's 2.889 (1.23x, the
# same bytes); at 16,384 tokens (320 rows) the default is the faster. An end-to-end chunk of ~2,400 tokens has ~47.
FUSED_Q2_0_SMALL = Tiles.parse("64x8x3h/128x8x3h")
SMALL_CHUNK_ROWS = 96  # mean routed rows an expert below which a chunk takes FUSED_Q2_0_SMALL (unswept between)


def small_chunk_tiles(experts: PromptExperts, n_pairs: int, n_experts: int) -> Tiles | None:
    """FUSED_Q2_0_SMALL for a Q2_0 chunk of few rows an expert, else None (the measured defaults)."""
    if experts.gate.spec.scale_per_64 and n_pairs < SMALL_CHUNK_ROWS * n_experts:
        return FUSED_Q2_0_SMALL
    return None


def _group_rows(path: str, experts: PromptExperts, tiles: Tiles | None, on_gpu: bool) -> int:
    """Rows per grouping tile: the launch shape's, else 64, or the rows of the fused Q2_0 kernels' default shape."""
    if tiles is not None:
        return tiles.rows
    if path == "fused" and experts.gate.spec.scale_per_64:
        return tile_config("gate_up", experts.gate.spec, experts.gate.rows, on_gpu).rows
    return grouping.TILE_ROWS


def _rounded(n_rows: int, k: int):
    return [((n_rows, k), torch.int8), ((n_rows, k // 32), torch.float32), ((n_rows, k // 32), torch.int32)]


def prompt_work_buffers(n_tokens: int, top_k: int, n_experts: int, n_embd: int, n_ff: int,
                        tile_rows: int = grouping.TILE_ROWS, path: str | None = None):
    """(shape, dtype) of the buffers `_run` takes from its scratch for a chunk of n_tokens on `path` (default: the
    one the switches pick): mmq's (x's codes, gate and up in float32, H's codes, the down rows; the dense path takes
    a subset), and on the fused path the larger of those and the Q2_0 kernels' under their default GPU shapes, which
    group by 128 rows and keep x and H as fp16 (`fused_q2_0_buffers`)."""
    rows = grouping.max_tiles_for(n_tokens * top_k, n_experts, tile_rows) * tile_rows
    mmq = [*_rounded(n_tokens, n_embd), ((rows, n_ff), torch.float32), ((rows, n_ff), torch.float32),
           *_rounded(rows, n_ff), ((rows, n_embd), torch.float32)]
    if (path or prompt_expert_path()) != "fused":  # the opt-in path's larger buffers only where it runs
        return mmq
    return max(mmq, fused_q2_0_buffers(n_tokens, top_k, n_experts, n_embd, n_ff), key=aligned_bytes)


def fused_q2_0_buffers(n_tokens: int, top_k: int, n_experts: int, n_embd: int, n_ff: int):
    """The fused path's buffers, in `_run`'s order, under the Q2_0 kernels' default GPU shapes (MEASURED_Q2_0):
    x's codes, H's codes, x as fp16 (an fp16 gate/up shape), H as fp16 (an fp16 down shape), the down rows (fp16
    under an "o" down shape)."""
    gate_up, down = MEASURED_Q2_0["gate_up"], MEASURED_Q2_0["down"]
    rows = grouping.max_tiles_for(n_tokens * top_k, n_experts, gate_up.rows) * gate_up.rows
    x16 = [((n_tokens, n_embd), torch.float16)] if gate_up.fp16 else []
    h16 = [((rows, n_ff), torch.float16)] if down.fp16 else []
    down_rows = torch.float16 if down.fp16_out else torch.float32
    return [*_rounded(n_tokens, n_embd), *_rounded(rows, n_ff), *x16, *h16, ((rows, n_embd), down_rows)]


def prompt_work_bytes(n_tokens: int, top_k: int, n_experts: int, n_embd: int, n_ff: int,
                      tile_rows: int = grouping.TILE_ROWS, path: str | None = None) -> int:
    """Bytes of a WorkArena that holds every expert work buffer of a chunk of n_tokens on `path` (`prompt_work_buffers`)."""
    return aligned_bytes(prompt_work_buffers(n_tokens, top_k, n_experts, n_embd, n_ff, tile_rows, path))


def moe_prefill(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, stack,
                path: str | None = None, slot_of: torch.Tensor | None = None, tiles: Tiles | None = None,
                scratch=None) -> torch.Tensor:
    """Sum over each token's top-k experts of weight * SwiGLU expert(x): x [T, embd] (bf16 or float32), topk_ids and
    topk_weights [T, k], stack with gate/up/down expert tensors (GGUF blocks) -> [T, embd] of x's dtype.

    `path` ("dense", "mmq", "fused") overrides the switches (`prompt_expert_path`). `slot_of` (int [E], the layer's
    expert ids -> index into stack, e.g. `PromptExperts.over_slots`) reads each expert where it lies. `tiles` gives
    every kernel of the path one launch shape (`strata bench moe-prefill --sweep`); the result does not depend on it.
    `scratch` (a `WorkArena`, e.g. over borrowed cache slots) holds the work buffers instead of PyTorch's allocator;
    the result is always a fresh tensor.
    """
    return _run(x, topk_ids, topk_weights, stack, path, use_triton(x), slot_of, tiles, scratch)


def moe_prefill_triton(x, topk_ids, topk_weights, stack, path=None, slot_of=None, tiles=None,
                       scratch=None) -> torch.Tensor:
    """The Triton kernels whatever the device (CPU tensors need TRITON_INTERPRET=1)."""
    return _run(x, topk_ids, topk_weights, stack, path, True, slot_of, tiles, scratch)


def moe_prefill_ref(x, topk_ids, topk_weights, stack, path=None, slot_of=None, scratch=None) -> torch.Tensor:
    """The same path through the torch references of its steps."""
    return _run(x, topk_ids, topk_weights, stack, path, False, slot_of, None, scratch)
