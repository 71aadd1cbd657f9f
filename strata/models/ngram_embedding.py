"""qwen4exp's per-layer n-gram embedding ("PLE"): rows of a huge table picked by a hash of the last 3 tokens.

Hash (Strata's src/kernels/ngram.cpp `ngram_rows`, uint64 arithmetic that wraps):
    ctx = [t, t-1, t-2]; a missing predecessor (< 0) or EOS cuts the context: it and every older slot become EOS
    mixed2 = ctx0*m0 ^ ctx1*m1,  mixed3 = mixed2 ^ ctx2*m2            (XOR, not a sum)
    row[h] = mixed % vocab[h] + offset[h]   heads 0..7 use mixed2, heads 8..15 mixed3
The 16 rows (160 values each) are concatenated head by head into one [16 * 160] vector per token.

Block (include/strata/kernels/ple.hpp, src/kernels/cuda/ple.cu), at one layer, on the residual R [T, hc, embd]:
    key   = gnorm(ple_key @ emb, norm_key)      query = gnorm(R, norm_query)      value = ple_value @ emb
    s[c]  = key[c] . query[c] / sqrt(embd);     gate[c] = sigmoid(sign(s) sqrt(max(|s|, 1e-6)))
    gated = value * gate[c];                    normalized = gnorm(gated, norm_conv)
    conv  = silu(sum_k w[:, k] * normalized(t - 3 (3 - k)))   depthwise, dilated by 3 over 9 past rows
    R    += gated + conv
gnorm is an RMSNorm per stream (hyper_connections.grouped_rms_norm).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from strata import switches
from strata.errors import StrataError
from strata.gguf.reader import GGUFModelFile
from strata.models.hyper_connections import grouped_rms_norm
from strata.models.ngram_rows import decode_rows, warm
from strata.models.weights import QuantWeight, linear

TABLE_TENSOR = "per_layer_token_embd.weight"
# Strata hard-codes these (include/strata/kernels/ngram.hpp); files may carry them as qwen4exp.ple.* fields.
EOS_TOKEN = 248044
MULTIPLIERS = (23703573157769, 20109073645365, 8052911324071)
HEAD_VOCAB_SIZES = (20000003, 20000023, 20000033, 20000047, 20000059, 20000063, 20000069, 20000077,
                    20000081, 20000093, 20000107, 20000147, 20000153, 20000159, 20000161, 20000171)
NGRAM_SIZE = 3
HEADS_PER_NGRAM = 8
CONV_KERNEL = 4
CONV_DILATION = 3
HISTORY_ROWS = (CONV_KERNEL - 1) * CONV_DILATION  # the normalized rows of the 9 previous tokens
ROW_CACHE_ROWS = 1 << 18  # dequantized rows kept (160 KiB per 256 rows of 160 float32)
CACHED_GATHER_ROWS = 1024  # larger gathers (prompt chunks: 16 rows a token) read their rows in one go, uncached


@dataclass(frozen=True)
class NgramHash:
    multipliers: tuple[int, ...] = MULTIPLIERS
    vocab_sizes: tuple[int, ...] = HEAD_VOCAB_SIZES
    eos: int = EOS_TOKEN
    heads_per_ngram: int = HEADS_PER_NGRAM

    @property
    def n_heads(self) -> int:
        return len(self.vocab_sizes)

    @property
    def offsets(self) -> tuple[int, ...]:
        return tuple(int(x) for x in np.cumsum((0,) + self.vocab_sizes[:-1]))

    @property
    def n_rows(self) -> int:
        return sum(self.vocab_sizes)

    @classmethod
    def from_gguf(cls, model: GGUFModelFile, arch: str) -> "NgramHash":
        meta = model.metadata
        hash_ = cls(
            multipliers=tuple(int(x) for x in meta.get(f"{arch}.ple.layer_multipliers", MULTIPLIERS)),
            vocab_sizes=tuple(int(x) for x in meta.get(f"{arch}.ple.head_vocab_sizes", HEAD_VOCAB_SIZES)),
            eos=int(meta.get(f"{arch}.ple.eos_token_id", EOS_TOKEN)),
            heads_per_ngram=int(meta.get(f"{arch}.ple.heads_per_ngram", HEADS_PER_NGRAM)),
        )
        ngram = int(meta.get(f"{arch}.ple.ngram_size", NGRAM_SIZE))
        if ngram != NGRAM_SIZE or len(hash_.multipliers) != NGRAM_SIZE:
            raise StrataError(f"{model.path}: {arch}.ple.ngram_size / layer_multipliers must describe 3-grams")
        if hash_.n_heads != (NGRAM_SIZE - 1) * hash_.heads_per_ngram:
            raise StrataError(f"{model.path}: {arch}.ple.head_vocab_sizes lists {hash_.n_heads} heads, expected "
                              f"{(NGRAM_SIZE - 1) * hash_.heads_per_ngram} (heads_per_ngram x 2)")
        offsets = meta.get(f"{arch}.ple.head_offsets")
        if offsets is not None and tuple(int(x) for x in offsets) != hash_.offsets:
            raise StrataError(f"{model.path}: {arch}.ple.head_offsets is not the running sum of head_vocab_sizes")
        return hash_

    def rows(self, tokens: np.ndarray, previous: tuple[int, int]) -> np.ndarray:
        """Table rows uint64 [T, n_heads] of tokens [T], after `previous` = (token 2 back, token 1 back) of the first
        (-1 where there is none)."""
        seq = np.concatenate([np.asarray(previous, dtype=np.int64), np.asarray(tokens, dtype=np.int64)])
        now, back1, back2 = seq[2:], seq[1:-1], seq[:-2]
        cut1 = (back1 < 0) | (back1 == self.eos)
        cut2 = cut1 | (back2 < 0) | (back2 == self.eos)
        ctx = [now, np.where(cut1, self.eos, back1), np.where(cut2, self.eos, back2)]
        m = [np.uint64(x) for x in self.multipliers]
        mixed2 = (ctx[0].astype(np.uint64) * m[0]) ^ (ctx[1].astype(np.uint64) * m[1])
        mixed3 = mixed2 ^ (ctx[2].astype(np.uint64) * m[2])
        vocab = np.asarray(self.vocab_sizes, dtype=np.uint64)
        offset = np.asarray(self.offsets, dtype=np.uint64)
        mixed = np.repeat(np.stack([mixed2, mixed3], 1), self.heads_per_ngram, axis=1)
        return mixed % vocab + offset


class NgramTable:
    """The table [rows, head_dim], left in its (memory-mapped) file; rows are dequantized on demand, the most
    recently used `cache_rows` of them kept."""

    def __init__(self, weight: QuantWeight, cache_rows: int = ROW_CACHE_ROWS, read_ahead=None):
        self.weight, self.cache_rows = weight, cache_rows
        self.read_ahead = read_ahead  # gguf.access_advice.ReadAhead over the table's file, or None
        self.cache: OrderedDict[int, torch.Tensor] = OrderedDict()
        self.hits = self.misses = 0
        warm(weight.raw.numpy(), weight.ggml_type)

    @property
    def head_dim(self) -> int:
        return self.weight.shape[-1]

    def gather(self, rows: np.ndarray) -> torch.Tensor:
        """float32 [T, n_heads * head_dim] of the rows [T, n_heads], head by head."""
        if rows.size > CACHED_GATHER_ROWS:
            # A row tensor per row costs ~1.5 us each in the cache and in the stack (93 ms for a 4,096-token chunk
            # on the H200 host): the rows are decoded in one go into the output, uncached.
            self.misses += rows.size
            if switches.get("STRATA_NGRAM_SYNC"):
                return self._gather_distinct(rows)
            out = torch.empty(rows.shape[0], rows.shape[1] * self.head_dim)
            self.gather_into(rows, out)
            return out
        flat = [int(r) for r in rows.reshape(-1)]
        wanted = sorted({r for r in flat if r not in self.cache})
        if wanted:
            if self.read_ahead is not None:  # their reads at once, not one page fault after another (cold drive)
                self.read_ahead.will_need(wanted)
            # One gather of the missing rows (only their pages of the mapping are read), decoded by ngram_rows:
            # the same bits as dequantize; a decode step's gather of 16 new rows took 154 us through torch's
            # indexing and dequantize, 67 us through numpy (session 11, the development VM), and the step waits.
            fresh = torch.empty(len(wanted), self.head_dim)
            self.gather_into(np.asarray(wanted, dtype=np.int64), fresh)
            for r, values in zip(wanted, fresh):
                self.cache[r] = values
        self.misses += len(wanted)
        self.hits += len(flat) - len(wanted)
        out = torch.stack([self.cache[r] for r in flat]) if flat else torch.zeros(0, self.head_dim)
        for r in flat:
            self.cache.move_to_end(r)
        while len(self.cache) > self.cache_rows:
            self.cache.popitem(last=False)
        return out.view(rows.shape[0], -1)

    def gather_into(self, rows: np.ndarray, out: torch.Tensor) -> None:
        """`gather`'s values written into out (float32 [T, n_heads * head_dim], contiguous, on the host: a pinned
        buffer), uncached: it touches nothing shared, so a host thread may run it beside the model."""
        decode_rows(self.weight.raw.numpy(), self.weight.ggml_type, rows.reshape(-1).astype(np.int64),
                    out.numpy().reshape(rows.size, self.head_dim))

    def _gather_distinct(self, rows: np.ndarray) -> torch.Tensor:
        """The previous large gather (STRATA_NGRAM_SYNC): the distinct rows dequantized by torch, then indexed."""
        unique, inverse = np.unique(rows.reshape(-1), return_inverse=True)
        fresh = self.weight[torch.from_numpy(unique.astype(np.int64))].dequantize(torch.float32)
        return fresh[torch.from_numpy(inverse.reshape(-1).astype(np.int64))].view(rows.shape[0], -1)


@dataclass
class PleWeights:
    key: QuantWeight  # ple_key [hc * embd, embd]
    value: QuantWeight  # ple_value [embd, embd]
    norm_key: torch.Tensor  # [hc * embd]
    norm_query: torch.Tensor
    norm_conv: torch.Tensor
    conv: torch.Tensor  # ple_conv1d [hc * embd, 4]: tap 3 is the current token, tap k is 3 (3 - k) tokens back


def ple_block(residual: torch.Tensor, emb: torch.Tensor, w: PleWeights, history: torch.Tensor,
              eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(new residual [T, hc, embd], new history [9, hc * embd]) for T tokens whose n-gram rows are `emb` [T, embd]."""
    n_tokens, hc, embd = residual.shape
    emb = emb.to(w.norm_key.dtype)
    key = grouped_rms_norm(linear(emb, w.key).view(n_tokens, hc, embd), w.norm_key, eps)
    query = grouped_rms_norm(residual, w.norm_query, eps)
    value = linear(emb, w.value).float()
    score = (key * query).sum(-1) / embd**0.5
    gate = torch.sigmoid(torch.sign(score) * score.abs().clamp(min=1e-6).sqrt())
    gated = value[:, None, :] * gate[:, :, None]
    normalized = grouped_rms_norm(gated, w.norm_conv, eps).reshape(n_tokens, -1)
    rows = torch.cat((history.float(), normalized))
    taps = w.conv.float()
    conv = sum(taps[:, k] * rows[k * CONV_DILATION : k * CONV_DILATION + n_tokens] for k in range(CONV_KERNEL))
    out = residual + gated + F.silu(conv).view(n_tokens, hc, embd)
    return out, rows[rows.shape[0] - HISTORY_ROWS :]
