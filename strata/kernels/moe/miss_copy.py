"""Copy-then-compute misses (`STRATA_MISSES_COPY=1`): a layer's missed experts copied from pinned host RAM into
device scratch by a gather launch (two in the engine: gate/up, then down beside the gate/up GEMV), then read by
the HBM-tuned decode GEMVs like cache slots.

Why: the decode GEMVs reading host RAM in place (zero-copy) load 2-byte words spread over a row's blocks; over PCIe
each warp's load becomes a few small read requests, whose headers (the likely cause, for `bench miss-bw` to
confirm) take a large share of the link (session 6: misses cost as if read at ~30 GB/s where pinned copies run at
55). Here every thread loads 16 contiguous bytes, so a warp asks for 512 aligned bytes at once, and each program's
loads are all issued before any returns (a chunk of CHUNK words: several loads a thread), which keeps the link's
bandwidth-delay product (~100 KB) in flight many times over.

The routing stays on the device (capturable, no host wait): program (pair p, chunk, part) reads ids[p] = e, and
copies chunk `chunk` of part (gate, up, down) of expert e into scratch slot p when e is missing from the cache
(`missing[e] >= 0`, DeviceTable's complement table) and p is the first pair routed to e (a verify window's tokens
that share a missed expert copy it once). Program (p, 0, 0) writes table[e] = that first pair (or -1: a hit), the
slot table the GEMVs then read, so every routed expert's entry is fresh; other entries are never read. Scratch
slots have the cache's layout (gate, up, down back to back, `DecodeExperts.of_slots`), so the GEMVs are the hits'
kernels on the hits' tiles and give the zero-copy path's bytes (the same sums in the same order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from strata.errors import StrataError

WORD = 4  # bytes a copied element (int32): 4 per thread make one 16-byte load


@dataclass(frozen=True)
class CopyConfig:
    """CHUNK int32 words a program (a multiple of 32 * 4 * warps: whole 16-byte loads for every thread), warps."""

    chunk: int = 4096
    warps: int = 4


# H200 by reasoning until `bench miss-bw --sweep` measures it: 16 KB a program, 4 warps (8 16-byte loads a thread,
# all issued at once); a 1.32 MiB qwen4exp expert is then ~85 programs (one wave on 132 SMs) and ~1.3 MB in flight.
DEFAULT_COPY = CopyConfig()
MEASURED_COPY: CopyConfig | None = None  # a `--sweep` line's chunk / warps, once measured


def copy_config() -> CopyConfig:
    return MEASURED_COPY or DEFAULT_COPY


@triton.jit
def _copy_part(src, dst, chunk, WORDS: tl.constexpr, CHUNK: tl.constexpr):
    """Words [chunk * CHUNK, +CHUNK) of a part of WORDS words, src -> dst (16-byte aligned: vector loads)."""
    at = chunk * CHUNK + tl.arange(0, CHUNK)
    live = at < WORDS
    tl.store(dst + at, tl.load(src + at, mask=live), mask=live)


@triton.jit
def _copy_misses_kernel(ids, missing, table, wg, wu, wd, scratch, stride_g, stride_u, stride_d, slot_words,
                        PAIRS: tl.constexpr, PAIRS_P2: tl.constexpr, WORDS_G: tl.constexpr, WORDS_D: tl.constexpr,
                        CHUNK: tl.constexpr, FIRST_PART: tl.constexpr):
    pair = tl.program_id(0)
    chunk = tl.program_id(1)
    part = tl.program_id(2) + FIRST_PART
    lane = tl.arange(0, PAIRS_P2)
    routed = tl.load(ids + lane, mask=lane < PAIRS, other=-1)
    e = tl.load(ids + pair)
    first = tl.min(tl.where((routed == e) & (lane < PAIRS), lane, PAIRS), axis=0)  # <= pair: e's first pair
    missed = tl.load(missing + e) >= 0
    if (chunk == 0) & (part == 0):
        tl.store(table + e, tl.where(missed, first, -1))
    if missed & (first == pair):
        slot = scratch + pair.to(tl.int64) * slot_words
        expert = e.to(tl.int64)
        if part == 0:
            _copy_part(wg + expert * stride_g, slot, chunk, WORDS_G, CHUNK)
        elif part == 1:
            _copy_part(wu + expert * stride_u, slot + WORDS_G, chunk, WORDS_G, CHUNK)
        else:
            _copy_part(wd + expert * stride_d, slot + 2 * WORDS_G, chunk, WORDS_D, CHUNK)


def scratch_bytes(host) -> int:
    """A scratch slot's bytes for host experts (gemv.DecodeExperts): gate, up, down back to back."""
    return host.gate.expert_bytes + host.up.expert_bytes + host.down.expert_bytes


def _words(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


def _unaligned(host) -> str | None:
    for name, m in (("gate", host.gate), ("up", host.up), ("down", host.down)):
        if m.expert_bytes % 16 or m.stride % 16 or m.raw.data_ptr() % 16:
            return f"the {name} experts' bytes ({m.expert_bytes} an expert at stride {m.stride})"
    return None


def copyable(host) -> bool:
    """Every part a whole number of 16-byte loads at 16-byte aligned starts (the shapes of the presets are:
    e.g. qwen4exp's Q2_0 rows of 2560 weights, 720 bytes, 640 of them an expert)."""
    return _unaligned(host) is None


def check_copyable(host) -> None:
    """`copyable`, else one line naming the part that is not."""
    what = _unaligned(host)
    if what is not None:
        raise StrataError(f"copied misses need 16-byte aligned experts; {what} are not")


ALL_PARTS, GATE_UP, DOWN = (0, 3), (0, 2), (2, 3)  # parts [first, end) of a launch: 0 gate, 1 up, 2 down


def copy_misses(ids: torch.Tensor, missing: torch.Tensor, host, scratch: torch.Tensor, table: torch.Tensor,
                config: CopyConfig | None = None, parts: tuple[int, int] = ALL_PARTS) -> None:
    """Missed experts of `ids` (int32 [T, k]) from `host` (DecodeExperts over the host stacks) into scratch
    (uint8 [T * k, scratch_bytes(host)] on the device), and table[e] for every routed e (the scratch slot, or -1),
    by the launch that copies part 0. `parts`: those parts only (GATE_UP, then DOWN: the gate/up GEMV can start
    while the down parts cross). On the GPU one launch (`launch_copy_misses`); elsewhere `copy_misses_ref`."""
    if not scratch.is_cuda:
        return copy_misses_ref(ids, missing, host, scratch, table, parts)
    launch_copy_misses(ids, missing, host, scratch, table, config, parts)


def launch_copy_misses(ids: torch.Tensor, missing: torch.Tensor, host, scratch: torch.Tensor, table: torch.Tensor,
                       config: CopyConfig | None = None, parts: tuple[int, int] = ALL_PARTS) -> None:
    """`_copy_misses_kernel`: copy_misses' contract in one launch (on the CPU: under TRITON_INTERPRET, the tests)."""
    cfg = config or copy_config()
    if cfg.chunk % (128 * cfg.warps):
        raise StrataError(f"copy chunk of {cfg.chunk} words is not whole 16-byte loads for {cfg.warps} warps")
    check_copyable(host)
    pairs = ids.numel()
    words_g, words_d = host.gate.expert_bytes // WORD, host.down.expert_bytes // WORD
    grid = (pairs, triton.cdiv(max(words_g, words_d), cfg.chunk), parts[1] - parts[0])
    _copy_misses_kernel[grid](
        ids.reshape(-1), missing, table, _words(host.gate.raw), _words(host.up.raw), _words(host.down.raw),
        _words(scratch.reshape(-1)), host.gate.stride // WORD, host.up.stride // WORD, host.down.stride // WORD,
        scratch.shape[1] // WORD, PAIRS=pairs, PAIRS_P2=triton.next_power_of_2(pairs), WORDS_G=words_g,
        WORDS_D=words_d, CHUNK=cfg.chunk, FIRST_PART=parts[0], num_warps=cfg.warps)


def copy_misses_ref(ids: torch.Tensor, missing: torch.Tensor, host, scratch: torch.Tensor, table: torch.Tensor,
                    parts: tuple[int, int] = ALL_PARTS) -> None:
    """The definition (the CPU form): the same slots and table entries, by torch on the host."""
    flat = ids.reshape(-1).tolist()
    for p, e in enumerate(flat):
        first = flat.index(e)
        missed = int(missing[e]) >= 0
        if parts[0] == 0:
            table[e] = first if missed else -1
        if not missed or first != p:
            continue
        offset = 0
        for i, m in enumerate((host.gate, host.up, host.down)):
            if parts[0] <= i < parts[1]:
                src = m.raw.reshape(-1)[e * m.stride: e * m.stride + m.expert_bytes]
                scratch[p, offset: offset + m.expert_bytes].copy_(src)
            offset += m.expert_bytes
