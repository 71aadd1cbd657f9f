"""The cache of one qwen4exp sequence: a HybridCache (attention KV, GatedDeltaNet states) plus what only qwen4exp
keeps: the QSA indexer's keys per attention layer, the n-gram block's token window and conv history, and the MTP
block's keys and values.

Indexer keys: every cell's raw key (before any norm) is kept; each completed block of 4 cells also gets its pooled
key (kernels/select/keys.pool_block_keys), computed once when the block completes. `dead` (the tail block's
stand-in) is the normalized raw key of cell 0.
"""

from __future__ import annotations

import torch

from strata.engine.hybrid_cache import HybridCache
from strata.engine.kv import new_kv_cache
from strata.errors import StrataError
from strata.kernels.select.keys import BLOCK, dead_key, pool_block_keys
from strata.models.ngram_embedding import HISTORY_ROWS


class IndexerKeys:
    """Raw and pooled indexer keys of one attention layer, float32, growing by doubling."""

    def __init__(self, key_dim: int, device: torch.device, n_rot: int, base: float, eps: float):
        self.key_dim, self.device, self.n_rot, self.base, self.eps = key_dim, device, n_rot, base, eps
        self.raw = torch.zeros(0, key_dim, device=device)
        self.pooled = torch.zeros(0, key_dim, device=device)
        self.dead = torch.zeros(key_dim, device=device)
        self.n_cells = 0
        self.n_pooled = 0

    @property
    def n_bytes(self) -> int:
        return 4 * (self.raw.numel() + self.pooled.numel() + self.dead.numel())

    def reset(self) -> None:
        self.n_cells = self.n_pooled = 0

    def append(self, start: int, raw: torch.Tensor, k_norm: torch.Tensor) -> None:
        """Store raw keys [T, Dk] of cells start.., then pool every block they complete."""
        end = start + raw.shape[0]
        self.reserve(end)
        self.raw[start:end] = raw.float()
        self.n_cells = end
        if start == 0:  # in place: a captured decode step reads this tensor
            self.dead.copy_(dead_key(self.raw[0], k_norm, self.eps))
        n_blocks = end // BLOCK
        if n_blocks > self.n_pooled:
            cells = self.raw[BLOCK * self.n_pooled : BLOCK * n_blocks]
            self.pooled[self.n_pooled : n_blocks] = pool_block_keys(cells, k_norm, self.n_pooled, self.eps,
                                                                    self.n_rot, self.base)
            self.n_pooled = n_blocks

    def truncate(self, n_cells: int) -> None:
        """Forget the cells from n_cells on (a verify window's rejected rows) and the blocks they completed."""
        self.n_cells = min(self.n_cells, n_cells)
        self.n_pooled = min(self.n_pooled, self.n_cells // BLOCK)

    def reserve(self, n_cells: int) -> None:
        """Storage for n_cells raw keys and the pooled keys of their blocks (the last one possibly unfinished: a
        static decode step writes its block's pooled key every step), growing by doubling."""
        if n_cells > self.raw.shape[0]:
            self.raw = _grown(self.raw, self.n_cells, max(n_cells, 2 * self.raw.shape[0], 256))
        n_blocks = -(-n_cells // BLOCK)
        if n_blocks > self.pooled.shape[0]:
            self.pooled = _grown(self.pooled, self.n_pooled, max(n_blocks, 2 * self.pooled.shape[0], 64))

    def keys(self) -> torch.Tensor:
        """Pooled keys [completed blocks, Dk]."""
        return self.pooled[: self.n_pooled]

    def load(self, raw: torch.Tensor, pooled: torch.Tensor, dead: torch.Tensor) -> None:
        """Hold exactly these raw keys [n, Dk], pooled keys [n // 4, Dk] and dead key (a checkpoint's)."""
        self.raw = torch.zeros(max(raw.shape[0], 256), self.key_dim, device=self.device)
        self.pooled = torch.zeros(max(pooled.shape[0], 64), self.key_dim, device=self.device)
        self.raw[: raw.shape[0]] = raw.to(self.device)
        self.pooled[: pooled.shape[0]] = pooled.to(self.device)
        self.dead.copy_(dead)
        self.n_cells, self.n_pooled = raw.shape[0], pooled.shape[0]


def _grown(rows: torch.Tensor, n_used: int, n_rows: int) -> torch.Tensor:
    """A zeroed [n_rows, ...] copy of `rows` holding its first n_used rows."""
    grown = torch.zeros(n_rows, *rows.shape[1:], dtype=rows.dtype, device=rows.device)
    grown[:n_used] = rows[:n_used]
    return grown


class Qwen4ExpCache(HybridCache):
    def __init__(self, recurrent_layers: tuple[bool, ...], n_kv_heads: int, head_dim: int,
                 conv_shape: tuple[int, int], state_shape: tuple[int, int, int], max_tokens: int,
                 kv_dtype: str | torch.dtype, conv_dtype: torch.dtype, device: torch.device, *,
                 indexer_key_dim: int, indexer_rot: int, rope_base: float, eps: float,
                 ple_width: int, ple_history_rows: int, mtp_layers: int = 0):
        super().__init__(recurrent_layers, n_kv_heads, head_dim, conv_shape, state_shape, max_tokens, kv_dtype,
                         conv_dtype, device)
        # The MTP block's own keys and values (dense: its attention never selects).
        self.mtp_kv = new_kv_cache(kv_dtype, mtp_layers, n_kv_heads, head_dim, max_tokens, device) if mtp_layers else None
        self.indexer = {layer: IndexerKeys(indexer_key_dim, device, indexer_rot, rope_base, eps)
                        for layer in self.kv_slot}
        self.ple_history = torch.zeros(ple_history_rows, ple_width, device=device)
        self.previous_tokens = (-1, -1)  # (2 back, 1 back) of the next token; -1 where none
        # A verify window's n-gram inputs: (conv history and previous_tokens before it, its tokens); None otherwise.
        self.window_ngram: tuple[torch.Tensor, tuple[int, int], list[int]] | None = None

    @property
    def n_bytes(self) -> int:
        extra = sum(keys.n_bytes for keys in self.indexer.values()) + 4 * self.ple_history.numel()
        extra += self.mtp_kv.n_bytes if self.mtp_kv is not None else 0
        return super().n_bytes + extra

    def check_ple(self, source: str, history_shape: tuple[int, int]) -> None:
        if tuple(self.ple_history.shape) != tuple(history_shape):
            raise StrataError(f"{source}: the cache's n-gram conv history has shape {list(self.ple_history.shape)}, "
                              f"the model needs {list(history_shape)}")

    def begin(self, start: int, n_tokens: int) -> None:
        super().begin(start, n_tokens)
        self.window_ngram = None

    def mark_window(self, tokens: list[int], history: torch.Tensor | None = None,
                    previous: tuple[int, int] | None = None) -> None:
        """The n-gram block is about to read a verify window's tokens: keep what keep_rows restores from. `history`,
        `previous`: the conv history and token window before the window, where they have already moved on (a static
        step hashes its rows before it runs; its history snapshot is a buffer of its own)."""
        if len(tokens) > HISTORY_ROWS:
            raise StrataError(f"a verify window of {len(tokens)} rows is longer than the n-gram history "
                              f"({HISTORY_ROWS} rows) it rolls back through")
        self.window_ngram = (self.ple_history.clone() if history is None else history,
                             self.previous_tokens if previous is None else previous, list(tokens))

    def keep_rows(self, n_rows: int) -> None:
        """After a verify window: keep its first n_rows tokens, as if only they had been decoded (GatedDeltaNet
        states and attention KV by HybridCache; then indexer keys, the n-gram token window and conv history)."""
        rows = self.length - self.window_start
        if 1 <= n_rows < rows and self.window_ngram is None:
            raise StrataError("the last step kept no n-gram history (not a verify window): its rows cannot be dropped")
        super().keep_rows(n_rows)
        for keys in self.indexer.values():
            keys.truncate(self.length)
        if self.window_ngram is not None and n_rows < rows:
            before, previous, tokens = self.window_ngram
            # The history after the window is the last HISTORY_ROWS of [before, its rows]: its rows are the tail.
            added = self.ple_history[HISTORY_ROWS - rows:]
            self.ple_history.copy_(torch.cat((before, added))[n_rows:n_rows + HISTORY_ROWS])
            seen = (*previous, *tokens[:n_rows])
            self.previous_tokens = (seen[-2], seen[-1])
        self.window_ngram = None

    def saved_state(self, n: int) -> dict[str, torch.Tensor]:
        """What a checkpoint of the first n tokens keeps beyond the hybrid cache's KV and states (views)."""
        out = {"ple_history": self.ple_history, "previous_tokens": torch.tensor(self.previous_tokens)}
        for layer, keys in self.indexer.items():
            out[f"raw.{layer}"] = keys.raw[:n]
            out[f"pooled.{layer}"] = keys.pooled[: n // BLOCK]
            out[f"dead.{layer}"] = keys.dead
        return out

    def saved_state_sizes(self, n: int) -> list[int]:
        """The bytes of saved_state(n)'s tensors in its order, for an n the growing buffers may not hold yet."""
        sizes = [self.ple_history.numel() * self.ple_history.element_size(), 8 * len(self.previous_tokens)]
        for keys in self.indexer.values():
            sizes += [4 * n * keys.key_dim, 4 * (n // BLOCK) * keys.key_dim, 4 * keys.key_dim]  # float32 rows
        return sizes

    def load_state(self, saved: dict[str, torch.Tensor]) -> None:
        self.ple_history.copy_(saved["ple_history"])
        self.previous_tokens = tuple(int(t) for t in saved["previous_tokens"])
        for layer, keys in self.indexer.items():
            keys.load(saved[f"raw.{layer}"], saved[f"pooled.{layer}"], saved[f"dead.{layer}"])

    def reset(self) -> None:
        super().reset()
        for keys in self.indexer.values():
            keys.reset()
        self.ple_history.zero_()
        self.previous_tokens = (-1, -1)
