"""Quantizers for Q4_K, Q5_K and Q6_K (gguf-py has none): a least-squares scale search per sub-block, then
sub-block scales rounded against one fp16 super-scale, then codes chosen again under the rounded scales."""

import numpy as np

# Inverse-scale candidates: the full code range stretched by these many steps, as ggml's own search does.
_STRETCH = np.linspace(-1.0, 1.0, 21)


def pack_planes(codes: np.ndarray, bits: int) -> np.ndarray:
    """[..., 8 // bits, g] codes -> [..., g] bytes, plane p in bits [p*bits, (p+1)*bits) (inverse of fields.planes)."""
    out = np.zeros(codes.shape[:-2] + codes.shape[-1:], dtype=np.uint8)
    for p in range(codes.shape[-2]):
        out |= (codes[..., p, :].astype(np.uint8) << (p * bits)).astype(np.uint8)
    return out


def pack_scale_min_k4(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins [n, 8] -> the 12-byte layout read by kquants.scale_min_k4."""
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    low_sc = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    low_m = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    rest = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
    return np.concatenate([low_sc, low_m, rest], axis=-1).astype(np.uint8)


def _fit_affine(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row of x [r, g]: scale s >= 0 and min m >= 0 minimizing |s*q - m - x|² over codes q in 0..nmax."""
    lo = np.minimum(x.min(axis=-1, keepdims=True), 0)  # the stored min only shifts down
    span = x.max(axis=-1, keepdims=True) - lo
    safe_span = np.where(span > 0, span, 1)
    best = (np.full_like(lo, np.inf), np.zeros_like(lo), -lo)
    for stretch in _STRETCH:
        q = np.clip(np.round((x - lo) * ((nmax + stretch) / safe_span)), 0, nmax)
        n, sq, sqq = x.shape[-1], q.sum(-1, keepdims=True), (q * q).sum(-1, keepdims=True)
        sx, sqx = x.sum(-1, keepdims=True), (q * x).sum(-1, keepdims=True)
        det = n * sqq - sq * sq
        s = np.divide(n * sqx - sq * sx, det, out=np.zeros_like(det), where=det > 0)
        offset = (sx - s * sq) / n
        # An offset above zero cannot be stored: pin it at zero and refit the scale alone.
        pinned = offset > 0
        s = np.where(pinned, np.divide(sqx, sqq, out=np.zeros_like(sqq), where=sqq > 0), s)
        offset = np.where(pinned, 0, offset)
        s = np.maximum(s, 0)
        err = ((s * q + offset - x) ** 2).sum(-1, keepdims=True)
        better = err < best[0]
        best = (np.where(better, err, best[0]), np.where(better, s, best[1]), np.where(better, -offset, best[2]))
    return best[1][..., 0], best[2][..., 0]


def _fit_symmetric(x: np.ndarray, nlo: int, nhi: int) -> np.ndarray:
    """Per row of x [r, g]: scale s (either sign) minimizing |s*q - x|² over codes q in nlo..nhi."""
    peak = np.take_along_axis(x, np.abs(x).argmax(axis=-1, keepdims=True), axis=-1)
    safe_peak = np.where(peak != 0, peak, 1)
    best_err, best_s = np.full_like(peak, np.inf), np.zeros_like(peak)
    for end in (nlo, nhi):  # map the peak onto either end of the code range
        for stretch in _STRETCH:
            q = np.clip(np.round(x * ((end + np.sign(end) * stretch) / safe_peak)), nlo, nhi)
            sqq, sqx = (q * q).sum(-1, keepdims=True), (q * x).sum(-1, keepdims=True)
            s = np.divide(sqx, sqq, out=np.zeros_like(sqq), where=sqq > 0)
            err = ((s * q - x) ** 2).sum(-1, keepdims=True)
            better = err < best_err
            best_err, best_s = np.where(better, err, best_err), np.where(better, s, best_s)
    return best_s[..., 0]


def _super_scale(values: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """Sub-block values [n, k] -> fp16 super-scale [n, 1] (as float64) and integer multiples in -levels..levels."""
    d = (np.abs(values).max(axis=-1, keepdims=True) / levels).astype(np.float16).astype(np.float64)
    ints = np.round(np.divide(values, d, out=np.zeros_like(values), where=d > 0))
    return d, np.clip(ints, -levels, levels)


def _affine_codes(blocks: np.ndarray, nmax: int):
    """Shared body of Q4_K and Q5_K: -> (d, dmin fp16 bytes, 12 scale bytes, codes [n, 8, 32])."""
    x = blocks.astype(np.float64).reshape(-1, 8, 32)
    s, m = _fit_affine(x.reshape(-1, 32), nmax)
    d, sc = _super_scale(s.reshape(-1, 8), 63)
    dmin, mn = _super_scale(m.reshape(-1, 8), 63)
    scale, shift = (d * sc)[..., None], (dmin * mn)[..., None]
    q = np.clip(np.round(np.divide(x + shift, scale, out=np.zeros_like(x), where=scale > 0)), 0, nmax)
    head = np.concatenate([d.astype(np.float16).view(np.uint8), dmin.astype(np.float16).view(np.uint8)], axis=-1)
    return head, pack_scale_min_k4(sc, mn), q.astype(np.uint8)


def quantize_q4_k(blocks: np.ndarray) -> np.ndarray:
    """float32 [n, 256] -> uint8 [n, 144]: d, dmin, scales, then 4-bit codes two sub-blocks per 32 bytes."""
    head, scales, q = _affine_codes(blocks, 15)
    qs = pack_planes(q.reshape(-1, 4, 2, 32), 4).reshape(-1, 128)
    return np.concatenate([head, scales, qs], axis=-1)


def quantize_q5_k(blocks: np.ndarray) -> np.ndarray:
    """float32 [n, 256] -> uint8 [n, 176]: as Q4_K, plus the fifth bit of sub-block j in bit j of 32 bytes."""
    head, scales, q = _affine_codes(blocks, 31)
    qh = pack_planes(q >> 4, 1)
    qs = pack_planes((q & 15).reshape(-1, 4, 2, 32), 4).reshape(-1, 128)
    return np.concatenate([head, scales, qh, qs], axis=-1)


def quantize_q6_k(blocks: np.ndarray) -> np.ndarray:
    """float32 [n, 256] -> uint8 [n, 210]: low nibbles, high 2 bits, 16 int8 scales, fp16 d."""
    x = blocks.astype(np.float64).reshape(-1, 16, 16)
    s = _fit_symmetric(x.reshape(-1, 16), -32, 31).reshape(-1, 16)
    d, sc = _super_scale(s, 127)
    scale = (d * sc)[..., None]
    q = np.clip(np.round(np.divide(x, scale, out=np.zeros_like(x), where=scale != 0)), -32, 31)
    q = (q + 32).astype(np.uint8)
    ql = pack_planes((q & 15).reshape(-1, 2, 2, 64), 4).reshape(-1, 128)
    qh = pack_planes((q >> 4).reshape(-1, 2, 4, 32), 2).reshape(-1, 64)
    tail = [sc.astype(np.int8).view(np.uint8), d.astype(np.float16).view(np.uint8)]
    return np.concatenate([ql, qh, *tail], axis=-1)
