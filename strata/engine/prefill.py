"""How a prompt is read: in equal chunks of at most N tokens, N sized to the memory left after the placement plan
(`--prefill auto[:MAX]`, Strata's default of up to 8,192), with progress reported as chunks finish."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from strata.errors import StrataError
from strata.models.config import ModelConfig

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


def activation_bytes_per_token(config: ModelConfig) -> int:
    """Scratch a prompt token needs while one layer runs (float32, generous): the residual and its norm, q/k/v and
    attention output, the routed experts' hidden rows, and one row of logits for the last position."""
    attention = (config.n_heads + 2 * config.n_kv_heads) * config.head_dim + config.n_heads * config.head_dim
    ffn = 3 * max(config.n_ff, config.n_experts_used * config.expert_ff + config.shared_expert_ff)
    return 4 * (4 * config.n_embd + attention + ffn)


def chunk_size(spec: int | str, config: ModelConfig, on_gpu: bool, free_bytes: int | None,
               mask_context: int = 0) -> int:
    """Tokens per chunk from `prefill_chunk`: a number, "auto" or "auto:MAX". `mask_context`: the context a dense
    KV cache attends with a [chunk, context] mask (bool, and SDPA's additive copy of it), 0 for the paged cache."""
    if isinstance(spec, int):
        if spec < 1:
            raise StrataError(f"prefill chunk must be at least 1 token, got {spec}")
        return spec
    head, _, cap = str(spec).partition(":")
    if head != "auto" or (cap and not cap.isdigit()):
        raise StrataError(f"--prefill must be a number of tokens, 'auto' or 'auto:MAX', got {spec!r}")
    cap_tokens = int(cap) if cap else DEFAULT_MAX_CHUNK
    if not on_gpu or free_bytes is None:
        return min(CPU_CHUNK, cap_tokens)
    per_token = activation_bytes_per_token(config) + MASK_BYTES_PER_CELL * mask_context
    fitting = free_bytes // 2 // per_token  # half the room: allocator slack, fragmentation
    return max(1, min(cap_tokens, fitting))


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
