"""How a prompt is read: in equal chunks of at most N tokens, N sized to the memory left after the placement plan
(`--prefill auto[:MAX]`, Strata's default of up to 8,192), with progress reported as chunks finish.

The chunk rule (`chunk_plan`), on a GPU with "auto": N is the most tokens whose scratch fits half the memory the
plan leaves free (the other half: allocator slack, fragmentation). When experts are offloaded and streamed, a chunk's
expert work buffers (x and H rounded to int8, gate and up in float32, the down rows: `prompt_work_bytes`) may instead
live in adjacent expert-cache slots it borrows (`--prefill-borrow`): then N is the most tokens whose other scratch
fits that half AND whose expert buffers fit the slots the cache can lend beside the streaming ring (half of those it
keeps); the slots are borrowed only when that gives larger chunks, only as many as the buffers need, and refilled
with their experts after the prompt. A memory too small for a chunk of one token is an error naming the options.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from strata.errors import StrataError
from strata.models.config import ModelConfig

BORROW_MODES = ("auto", "on", "off")

DEFAULT_MAX_CHUNK = 8192
MASK_BYTES_PER_CELL = 5  # a bool mask cell and its float32 bias in SDPA
CPU_CHUNK = 512  # the CPU gains nothing from bigger chunks, and their activations cost RAM


@dataclass(frozen=True)
class PrefillProgress:
    done: int  # prompt tokens read so far
    total: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.done / self.seconds if self.seconds else 0.0


@dataclass(frozen=True)
class ChunkPlan:
    tokens: int  # the most tokens a chunk has
    work_slots: int = 0  # adjacent expert-cache slots a streamed chunk borrows for its expert work buffers
    free_tokens: int = 0  # the tokens a chunk would have without borrowing


def activation_bytes_per_token(config: ModelConfig, routed_in_slots: bool = False) -> int:
    """Scratch a prompt token needs while one layer runs (float32, generous): the residual and its norm, q/k/v and
    attention output, the experts' hidden rows (the routed ones' not, when they live in borrowed slots), and one
    row of logits for the last position."""
    attention = (config.n_heads + 2 * config.n_kv_heads) * config.head_dim + config.n_heads * config.head_dim
    routed = 0 if routed_in_slots else config.n_experts_used * config.expert_ff
    ffn = 3 * max(config.n_ff, routed + config.shared_expert_ff)
    return 4 * (4 * config.n_embd + attention + ffn)


def expert_work_bytes(config: ModelConfig, n_tokens: int) -> int:
    """The expert work buffers of a chunk of n_tokens, as the prompt kernels take them (`prompt_work_bytes`)."""
    from strata.kernels.moe.prefill import prompt_work_bytes

    return prompt_work_bytes(n_tokens, config.n_experts_used, config.n_experts, config.n_embd, config.expert_ff)


def _cap(spec: int | str) -> int | None:
    """The MAX of "auto[:MAX]", None for an explicit number of tokens (checked)."""
    if isinstance(spec, int):
        if spec < 1:
            raise StrataError(f"prefill chunk must be at least 1 token, got {spec}")
        return None
    head, _, cap = str(spec).partition(":")
    if head != "auto" or (cap and not cap.isdigit()):
        raise StrataError(f"--prefill must be a number of tokens, 'auto' or 'auto:MAX', got {spec!r}")
    return int(cap) if cap else DEFAULT_MAX_CHUNK


def _too_small(free_bytes: int, per_token: int) -> StrataError:
    return StrataError(f"prompt chunks: the {free_bytes / 2**20:.0f} MiB the placement plan leaves on the device "
                       f"cannot hold the scratch of a one-token chunk ({2 * per_token / 2**20:.1f} MiB with slack): "
                       "raise --vram-budget, or lower --ctx or --expert-cache")


def chunk_size(spec: int | str, config: ModelConfig, on_gpu: bool, free_bytes: int | None,
               mask_context: int = 0) -> int:
    """Tokens per chunk from `prefill_chunk`: a number, "auto" or "auto:MAX". `mask_context`: the context a dense
    KV cache attends with a [chunk, context] mask (bool, and SDPA's additive copy of it), 0 for the paged cache."""
    cap_tokens = _cap(spec)
    if cap_tokens is None:
        return spec
    if not on_gpu or free_bytes is None:
        return min(CPU_CHUNK, cap_tokens)
    per_token = activation_bytes_per_token(config) + MASK_BYTES_PER_CELL * mask_context
    fitting = free_bytes // 2 // per_token  # half the room: allocator slack, fragmentation
    if fitting < 1:
        raise _too_small(free_bytes, per_token)
    return min(cap_tokens, fitting)


def chunk_plan(spec: int | str, config: ModelConfig, on_gpu: bool, free_bytes: int | None, mask_context: int = 0,
               slot_bytes: int = 0, lendable_slots: int = 0, borrow: str = "auto") -> ChunkPlan:
    """`chunk_size`, and the slots a streamed chunk borrows for its expert work buffers (the rule in this module's
    docstring). `borrow`: "auto" (where it gives larger "auto" chunks on a GPU), "on" (always, the chunk's size
    unchanged: CPU tests run the GPU's code path), "off". `lendable_slots`: 0 where nothing streams."""
    if borrow not in BORROW_MODES:
        raise StrataError(f"--prefill-borrow must be one of {', '.join(BORROW_MODES)}, got {borrow!r}")
    cap_tokens = _cap(spec)
    nothing_to_size = cap_tokens is None or not on_gpu or free_bytes is None  # an explicit size, or the CPU's
    if borrow == "off" or not lendable_slots or not slot_bytes or (borrow == "auto" and nothing_to_size):
        tokens = chunk_size(spec, config, on_gpu, free_bytes, mask_context)
        return ChunkPlan(tokens, 0, tokens)
    if borrow == "on":
        tokens = chunk_size(spec, config, on_gpu, free_bytes, mask_context)
        need = -(-expert_work_bytes(config, tokens) // slot_bytes)
        if need > lendable_slots:
            raise StrataError(f"--prefill-borrow on: a chunk of {tokens} tokens needs {need} expert-cache slots for "
                              f"its work buffers, the cache can lend {lendable_slots} (lower --prefill)")
        return ChunkPlan(tokens, need, tokens)
    per_token = activation_bytes_per_token(config) + MASK_BYTES_PER_CELL * mask_context
    alone = free_bytes // 2 // per_token
    if alone >= cap_tokens:
        return ChunkPlan(cap_tokens, 0, cap_tokens)
    other = activation_bytes_per_token(config, routed_in_slots=True) + MASK_BYTES_PER_CELL * mask_context
    lendable = lendable_slots * slot_bytes

    def fits(t: int) -> bool:
        return t * other <= free_bytes // 2 and expert_work_bytes(config, t) <= lendable

    low, high = 0, cap_tokens  # the largest t that fits: fits() holds for low, fails above high
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    if low <= alone:
        if alone < 1:
            raise _too_small(free_bytes, per_token)
        return ChunkPlan(alone, 0, alone)
    return ChunkPlan(low, -(-expert_work_bytes(config, low) // slot_bytes), alone)


def equal_chunks(n_tokens: int, max_chunk: int) -> list[tuple[int, int]]:
    """[start, end) bounds of the fewest chunks of at most max_chunk tokens, as equal in size as possible."""
    if n_tokens <= 0:
        return []
    count = -(-n_tokens // max_chunk)
    base, extra = divmod(n_tokens, count)
    bounds, start = [], 0
    for i in range(count):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def prompt_chunks(n_tokens: int, max_chunk: int, equal: bool) -> list[tuple[int, int]]:
    """Equal chunks for "auto" (Strata cuts a prompt so); for an explicit size, chunks of exactly that many."""
    if equal:
        return equal_chunks(n_tokens, max_chunk)
    return [(start, min(start + max_chunk, n_tokens)) for start in range(0, n_tokens, max_chunk)]


class ProgressClock:
    """Calls `report` with a PrefillProgress after each chunk of a prompt."""

    def __init__(self, total: int, report: Callable[[PrefillProgress], None] | None):
        self.total, self.report, self.started = total, report, time.perf_counter()

    def chunk_done(self, done: int) -> None:
        if self.report is not None:
            self.report(PrefillProgress(done, self.total, time.perf_counter() - self.started))


def describe_chunks(plan, config: ModelConfig, mask_context: int, spec: int | str = "auto",
                    borrow: str = "auto") -> str:
    """`strata info --plan`'s prompt line: the chunk the rule gives on this plan's budget (the engine also bounds it
    by what the device has free), and the slots it borrows."""
    from strata.engine.prefill_stream import WORK_SHARE, ring_size

    if plan.vram_budget is None:
        return f"prompt chunks up to {chunk_size(spec, config, False, None)} tokens (no device budget to size them)"
    experts = plan.expert_bytes if plan.all_resident else plan.n_slots * plan.expert_bytes_each
    free = max(plan.vram_budget - plan.dense_bytes - plan.kv_bytes - experts, 0)
    ring = 0 if plan.all_resident else ring_size(plan.n_slots, config.n_experts)
    lendable = int((plan.n_slots - ring) * WORK_SHARE) if ring else 0
    chunk = chunk_plan(spec, config, True, free, mask_context, plan.expert_bytes_each, lendable, borrow)
    line = f"prompt chunks up to {chunk.tokens} tokens from the {free / 2**30:.2f} GiB left (half of it, for slack)"
    if chunk.work_slots:
        line += (f"; their expert work buffers in {chunk.work_slots} borrowed cache slots "
                 f"({chunk.work_slots * plan.expert_bytes_each / 2**30:.2f} GiB, of {lendable} lendable beside the "
                 f"{ring}-slot streaming ring; {chunk.free_tokens} tokens without borrowing)")
    elif ring:
        line += "; no slots borrowed" + (" (--prefill-borrow off)" if borrow == "off" else
                                        f" (they would not make chunks larger; {lendable} lendable)")
    return line
