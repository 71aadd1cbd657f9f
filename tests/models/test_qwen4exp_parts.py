"""qwen4exp's parts against float64 references written loop by loop from Strata's formulas, and the n-gram hash
against rows computed by hand with Strata's constants."""

import numpy as np
import pytest
import torch

from strata.models.gated_deltanet import GDNShape
from strata.models.hyper_connections import HyperConnectionWeights, hc_read, hc_write
from strata.models.ngram_embedding import EOS_TOKEN, NgramHash, NgramTable, PleWeights, ple_block
from strata.models.qwen4exp_mixers import Qwen4ExpGDNWeights, qwen4exp_gdn
from strata.models.weights import QuantWeight

BOUND = 1e-5  # float32 against float64, relative to the largest value


def _weight(t: torch.Tensor) -> QuantWeight:
    return QuantWeight("w", 0, tuple(t.shape), t.float().contiguous().view(torch.uint8))


def _close(ours: torch.Tensor, ref: torch.Tensor) -> bool:
    return ((ours.double() - ref).abs().max() / ref.abs().max()).item() < BOUND


# ---------------------------------------------------------------------------------------------- n-gram hash

# Rows of (t, t-1, t-2) for the 16 heads, computed by hand with Strata's multipliers and head vocab sizes
# (uint64 products, XOR, modulo the head's vocab, plus the head's offset).
HAND_ROWS = {
    (1000, 2000, 3000): [1531522, 26458325, 48967948, 72533165, 95637132, 116681687, 138257734, 140376286,
                         167316121, 196780774, 201192701, 239730030, 244538402, 269354175, 284294431, 319007479],
    (248043, EOS_TOKEN, EOS_TOKEN): [5224855, 30284709, 43929396, 72280505, 94883662, 109322550, 131203836,
                                     140794991, 166459826, 181131035, 209237474, 226844350, 246236135, 265823742,
                                     299063341, 305586418],
}


def test_ngram_rows_match_hand_computed_rows():
    hash_ = NgramHash()
    assert hash_.rows(np.array([1000]), (3000, 2000))[0].tolist() == HAND_ROWS[(1000, 2000, 3000)]
    # no predecessors: both slots read EOS
    assert hash_.rows(np.array([248043]), (-1, -1))[0].tolist() == HAND_ROWS[(248043, EOS_TOKEN, EOS_TOKEN)]
    # an EOS one back cuts the older slot too, whatever token sits there
    assert hash_.rows(np.array([248043]), (1234, EOS_TOKEN))[0].tolist() == HAND_ROWS[(248043, EOS_TOKEN, EOS_TOKEN)]


def test_ngram_rows_of_a_sequence_equal_rows_token_by_token():
    hash_ = NgramHash()
    tokens = np.array([7, 3000, 2000, 1000, EOS_TOKEN, 5, 6, 9])
    whole = hash_.rows(tokens, (-1, 42))
    window = [-1, 42]
    for i, t in enumerate(tokens):
        assert whole[i].tolist() == hash_.rows(np.array([t]), (window[-2], window[-1]))[0].tolist()
        window.append(int(t))
    assert whole[3].tolist() == HAND_ROWS[(1000, 2000, 3000)]
    assert (whole < hash_.n_rows).all() and hash_.offsets[1] == 20000003 and hash_.n_rows == 320001446


def test_table_gather_returns_rows_head_by_head_and_keeps_a_bounded_cache():
    table = torch.arange(50 * 4, dtype=torch.float32).view(50, 4)
    ngram = NgramTable(_weight(table), cache_rows=5)
    rows = np.array([[3, 7], [7, 9], [3, 3]], dtype=np.uint64)
    out = ngram.gather(rows)
    assert torch.equal(out, torch.cat([table[rows[:, 0].astype(np.int64)], table[rows[:, 1].astype(np.int64)]], 1))
    assert (ngram.misses, ngram.hits) == (3, 3) and len(ngram.cache) == 3
    ngram.gather(np.array([[10, 11], [12, 13]], dtype=np.uint64))
    assert list(ngram.cache) == [3, 10, 11, 12, 13]  # 7 and 9 were used least recently (3 last, by token 3)


# ---------------------------------------------------------------------------------------------- hyper-connections


def _hc_read_f64(r, norm, down, up, inject, eps=1e-6):
    """gr_read loop by loop over streams, in float64 (Strata's src/kernels/gr_parity.cpp reference)."""
    hc, n = r.shape
    xn = torch.empty_like(r)
    for c in range(hc):
        xn[c] = r[c] / torch.sqrt((r[c] ** 2).mean() + eps) * norm[c * n : (c + 1) * n]
    flat = xn.reshape(-1)
    proj = down @ flat
    low = (proj / hc) / (1 + torch.exp(-(proj / hc)))
    gate = up @ low
    mixed = torch.zeros(n, dtype=r.dtype)
    for c in range(hc):
        mixed += xn[c] * (1 / (1 + torch.exp(-gate[c * n : (c + 1) * n])))
    return mixed / hc, inject @ flat


def test_hc_read_and_write_match_a_float64_loop():
    g = torch.Generator().manual_seed(0)
    hc, n, rank, tokens = 4, 32, 8, 3
    r = torch.randn(tokens, hc, n, generator=g, dtype=torch.float64) * 3
    norm = torch.rand(hc * n, generator=g, dtype=torch.float64) + 0.5
    down, up = (torch.randn(s, generator=g, dtype=torch.float64) * 0.3 for s in ((rank, hc * n), (hc * n, rank)))
    inject = torch.randn(hc, hc * n, generator=g, dtype=torch.float64) * 0.1
    w = HyperConnectionWeights(norm.float(), _weight(down), _weight(up), _weight(inject))
    mixed, inj = hc_read(r.float(), w, 1e-6)
    y = torch.randn(tokens, n, generator=g, dtype=torch.float64)
    written = hc_write(r.float(), y.float(), inj)
    for t in range(tokens):
        want_mixed, want_inject = _hc_read_f64(r[t], norm, down, up, inject)
        assert _close(mixed[t], want_mixed) and _close(inj[t], want_inject)
        want_r = torch.stack([r[t, c] + y[t] * 2 / (1 + torch.exp(-want_inject[c] / hc)) for c in range(hc)])
        assert _close(written[t], want_r)
    assert torch.equal(hc_write(r.float(), y.float(), torch.zeros(tokens, hc)), r.float() + y.float()[:, None])


# ---------------------------------------------------------------------------------------------- n-gram block


def _ple_f64(r, emb, key, value, nk, nq, nc, conv, history, eps=1e-6):
    """The block one token at a time in float64; the conv reads the normalized rows of t-9, t-6, t-3 and t."""
    tokens, hc, n = r.shape

    def gnorm(x, w):
        return torch.stack([x[c] / torch.sqrt((x[c] ** 2).mean() + eps) * w[c * n : (c + 1) * n] for c in range(hc)])

    rows, out = list(history), []
    for t in range(tokens):
        k, q = gnorm((key @ emb[t]).view(hc, n), nk), gnorm(r[t], nq)
        v = value @ emb[t]
        gated = torch.stack([v * torch.sigmoid(torch.sign(s) * torch.sqrt(torch.clamp(s.abs(), min=1e-6)))
                             for s in ((k * q).sum(-1) / n**0.5)])
        rows.append(gnorm(gated, nc).reshape(-1))
        pre = sum(conv[:, j] * rows[-1 - 3 * (3 - j)] for j in range(4))
        out.append(r[t] + gated + (pre * torch.sigmoid(pre)).view(hc, n))
    return torch.stack(out), torch.stack(rows[-9:])


def test_ngram_block_matches_a_float64_loop_in_one_pass_and_in_steps():
    g = torch.Generator().manual_seed(1)
    hc, n, tokens = 4, 16, 7
    f64 = dict(generator=g, dtype=torch.float64)
    r, emb = torch.randn(tokens, hc, n, **f64), torch.randn(tokens, n, **f64)
    key, value = torch.randn(hc * n, n, **f64) * 0.2, torch.randn(n, n, **f64) * 0.2
    nk, nq, nc = (torch.rand(hc * n, **f64) + 0.5 for _ in range(3))
    conv, history = torch.randn(hc * n, 4, **f64), torch.randn(9, hc * n, **f64)
    w = PleWeights(_weight(key), _weight(value), nk.float(), nq.float(), nc.float(), conv.float())
    want, want_history = _ple_f64(r, emb, key, value, nk, nq, nc, conv, history)
    out, new_history = ple_block(r.float(), emb.float(), w, history.float(), 1e-6)
    assert _close(out, want) and _close(new_history, want_history)
    hist, parts = history.float(), []
    for t in range(tokens):
        part, hist = ple_block(r[t : t + 1].float(), emb[t : t + 1].float(), w, hist, 1e-6)
        parts.append(part)
    assert _close(torch.cat(parts), want) and _close(hist, want_history)


# ---------------------------------------------------------------------------------------------- Gated DeltaNet


def test_gdn_value_heads_read_key_heads_modulo_and_gate_with_sigmoid():
    g = torch.Generator().manual_seed(2)
    s = GDNShape(n_k_heads=2, n_v_heads=6, k_dim=8, v_dim=4, conv_kernel=4)
    embd, tokens = 16, 5
    f64 = dict(generator=g, dtype=torch.float64)
    x = torch.randn(tokens, embd, **f64)
    qkv_w, z_w = torch.randn(s.conv_channels, embd, **f64) * 0.3, torch.randn(24, embd, **f64) * 0.3
    a_w, b_w = torch.randn(6, embd, **f64) * 0.3, torch.randn(6, embd, **f64) * 0.3
    conv, dt, decay = torch.randn(s.conv_channels, 4, **f64) * 0.5, torch.randn(6, **f64), -torch.rand(6, **f64)
    norm, out_w = torch.rand(4, **f64) + 0.5, torch.randn(embd, 24, **f64) * 0.3
    w = Qwen4ExpGDNWeights(_weight(qkv_w), _weight(z_w), _weight(a_w), _weight(b_w), conv.float(), dt.float(),
                           decay.float(), norm.float(), _weight(out_w))
    ours, _, _ = qwen4exp_gdn(w, s, x.float(), torch.zeros(3, s.conv_channels), torch.zeros(6, 8, 4), 1e-6)

    # float64, token by token, head by head
    window = torch.cat([torch.zeros(3, s.conv_channels, dtype=torch.float64), x @ qkv_w.T])
    state = torch.zeros(6, 8, 4, dtype=torch.float64)
    want = []
    for t in range(tokens):
        c = (window[t : t + 4].T * conv).sum(1)
        h = c * torch.sigmoid(c)
        q, k, v = h[:16].view(2, 8), h[16:32].view(2, 8), h[32:].view(6, 4)
        beta = torch.sigmoid(b_w @ x[t])
        gl = torch.nn.functional.softplus(a_w @ x[t] + dt) * decay
        z = (z_w @ x[t]).view(6, 4)
        y = []
        for head in range(6):
            qh, kh = q[head % 2], k[head % 2]  # modulo, not head // 3
            qh, kh = qh / torch.sqrt((qh**2).sum() + 1e-6) / 8**0.5, kh / torch.sqrt((kh**2).sum() + 1e-6)
            state[head] *= torch.exp(gl[head])
            d = (v[head] - state[head].T @ kh) * beta[head]
            state[head] += torch.outer(kh, d)
            o = state[head].T @ qh
            y.append(o / torch.sqrt((o**2).mean() + 1e-6) * norm * torch.sigmoid(z[head]))
        want.append(out_w @ torch.cat(y))
    assert _close(ours, torch.stack(want))


def test_a_large_gather_reads_its_rows_at_once_and_equals_the_cached_one(monkeypatch):
    """Prompt chunks take the uncached one-read path: the same rows as the row cache gives, head by head."""
    import strata.models.ngram_embedding as ngram_module

    table = torch.randn(300, 4)
    rows = np.random.default_rng(0).integers(0, 300, (40, 2)).astype(np.uint64)
    cached = NgramTable(_weight(table)).gather(rows)
    monkeypatch.setattr(ngram_module, "CACHED_GATHER_ROWS", 8)
    at_once = NgramTable(_weight(table))
    assert torch.equal(at_once.gather(rows), cached)
    assert at_once.misses == rows.size and at_once.hits == 0  # every row decoded, none deduplicated or cached
