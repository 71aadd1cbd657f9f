"""A layer's streamed experts copied into device slots in one launch, read by the GPU straight from pinned host RAM.

Why: copying each expert as three `copy_` calls (gate, up, down) cost the host ~11 us a call, more than the link
took to move the bytes (issue 6: 5,732 copies, 65 ms on 12 full-size layers), so the GPU waited on the host. Here
the host uploads one small (expert, slot) list and launches one kernel; the kernel reads the experts' bytes through
their device-visible (UVA) addresses, as the decode kernels read missing experts (engine/direct_misses.py).

`gather_experts(slots, stack, experts, targets)`: for each i, slot targets[i] gets expert experts[i]'s gate, up and
down bytes back to back from its first byte (the layout of `ExpertCache.admit`). On a GPU with pinned host stacks
the Triton kernel (`gather_experts_triton`) runs; elsewhere `gather_experts_ref` (indexed torch copies). The copy is
exact: both move the same bytes, a test compares them byte for byte.

Launch shape (`GatherConfig`): persistent programs (`programs`), each copying `block` words per step of the widest
word (8, 4, 2 or 1 bytes) that every part size, slot size and base address allows; `warps` per program. A program
has one step's loads in flight, so the link's latency times its rate (~2 us x 55 GB/s = ~110 KB) needs about
110 KB / (block x 8 B) programs at once; more programs take SM time from the layer computing beside the copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from strata.errors import StrataError

WORD_DTYPES = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


@dataclass(frozen=True)
class GatherConfig:
    # Half the H200's SMs: 66 x 16 KB in flight is still well past the link's ~110 KB. With a program on every SM
    # the compute stream's cuBLAS sm90 GEMMs did not start until the gather ended (session 10's timeline of a
    # streamed prompt: its copy and its compute then serialised, 459 ms against 376 at 66 programs, 378 at 32).
    programs: int = 66
    block: int = 2048  # words a program copies per step (16 KB of int64)
    warps: int = 4

    @classmethod
    def parse(cls, text: str) -> "GatherConfig":
        """"p132b2048w4" (programs, words per step, warps); parts left out keep the default's."""
        values, key, digits = {}, None, ""
        names = {"p": "programs", "b": "block", "w": "warps"}
        for ch in text.strip().lower() + "$":
            if ch.isdigit():
                digits += ch
                continue
            if key is not None:
                if not digits:
                    break
                values[names[key]] = int(digits)
            if ch == "$":
                return cls(**{**cls().__dict__, **values})._checked(text)
            if ch not in names:
                break
            key, digits = ch, ""
        raise StrataError(f"expert gather config {text!r}: write it as p132b2048w4 (programs, words per step, warps)")

    def _checked(self, text: str) -> "GatherConfig":
        if self.programs < 1 or self.block < 16 or self.block & (self.block - 1) or self.warps not in (1, 2, 4, 8, 16):
            raise StrataError(f"expert gather config {text!r}: programs >= 1, block a power of two >= 16, warps 1-16")
        return self

    def name(self) -> str:
        return f"p{self.programs}b{self.block}w{self.warps}"


def part_bytes(stack) -> tuple[int, int, int]:
    """One expert's gate, up and down bytes."""
    return tuple(p.raw.numel() // p.raw.shape[0] for p in (stack.gate, stack.up, stack.down))


def word_bytes(slots: torch.Tensor, stack) -> int:
    """The widest word that divides every part size, the slot size and every base address."""
    sizes = [*part_bytes(stack), slots.stride(0)]
    addresses = [slots.data_ptr(), *(p.raw.data_ptr() for p in (stack.gate, stack.up, stack.down))]
    for width in (8, 4, 2):
        if all(v % width == 0 for v in sizes + addresses):
            return width
    return 1


def _flat_words(tensor: torch.Tensor, width: int) -> torch.Tensor:
    return tensor.reshape(-1).view(WORD_DTYPES[width])


def gather_experts_ref(slots: torch.Tensor, stack, experts: torch.Tensor, targets: torch.Tensor) -> None:
    """Indexed torch copies: each part of the chosen experts into its byte range of the target slots."""
    offset = 0
    for part, n in zip((stack.gate, stack.up, stack.down), part_bytes(stack)):
        rows = part.raw.reshape(part.raw.shape[0], n).index_select(0, experts.to(part.raw.device, torch.long))
        slots[targets.to(slots.device, torch.long), offset : offset + n] = rows.to(slots.device)
        offset += n


@triton.jit(do_not_specialize=["n_tiles"])
def _gather_kernel(gate, up, down, dst, pairs, n_tiles, tiles_per_expert, gate_words, up_words, down_words,
                   slot_words, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    ends_up = gate_words + up_words
    total = ends_up + down_words
    for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        pair = tile // tiles_per_expert
        expert = tl.load(pairs + 2 * pair).to(tl.int64)
        slot = tl.load(pairs + 2 * pair + 1).to(tl.int64)
        w = (tile % tiles_per_expert) * BLOCK + lanes
        in_gate = w < gate_words
        in_up = (w >= gate_words) & (w < ends_up)
        in_down = (w >= ends_up) & (w < total)
        v = tl.load(gate + expert * gate_words + w, mask=in_gate, other=0)
        v = tl.where(in_up, tl.load(up + expert * up_words + (w - gate_words), mask=in_up, other=0), v)
        v = tl.where(in_down, tl.load(down + expert * down_words + (w - ends_up), mask=in_down, other=0), v)
        tl.store(dst + slot * slot_words + w, v, mask=w < total)


@dataclass(frozen=True)
class GatherOperands:
    """What a launch reads and writes, as words: the three host parts, the slots, their sizes (made once a layer's
    stack: views and address checks cost the host more than the launch's other work)."""

    sources: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    dst: torch.Tensor
    words: tuple[int, int, int]  # gate, up, down words an expert
    slot_words: int

    @classmethod
    def of(cls, slots: torch.Tensor, stack) -> "GatherOperands":
        width = word_bytes(slots, stack)
        sources = tuple(_flat_words(p.raw, width) for p in (stack.gate, stack.up, stack.down))
        words = tuple(b // width for b in part_bytes(stack))
        return cls(sources, _flat_words(slots, width), words, slots.stride(0) // width)


def gather_experts_triton(slots: torch.Tensor, stack, pairs: torch.Tensor, config: GatherConfig | None = None,
                          operands: GatherOperands | None = None) -> None:
    """One launch: `pairs` int32 [n, 2] (expert, slot) on the slots' device; the host stacks pinned (on a GPU)."""
    config = config or GatherConfig()
    n = pairs.shape[0]
    if n == 0:
        return
    ops = operands or GatherOperands.of(slots, stack)
    tiles_per_expert = triton.cdiv(sum(ops.words), config.block)
    n_tiles = n * tiles_per_expert
    _gather_kernel[(min(config.programs, n_tiles),)](*ops.sources, ops.dst, pairs, n_tiles, tiles_per_expert,
                                                     *ops.words, ops.slot_words, BLOCK=config.block,
                                                     num_warps=config.warps)


def gather_pairs(experts: np.ndarray, targets: np.ndarray) -> torch.Tensor:
    """The kernel's (expert, slot) list, int32 [n, 2], on the host."""
    return torch.from_numpy(np.stack([experts, targets], axis=1).astype(np.int32))


def check_slots(slots: torch.Tensor, stack) -> None:
    if sum(part_bytes(stack)) > slots.shape[1]:
        raise StrataError(f"a slot of {slots.shape[1]} bytes cannot hold an expert of {sum(part_bytes(stack))}")
