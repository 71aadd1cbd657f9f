"""The k-quants (Q2_K .. Q6_K): 256-weight super-blocks with an fp16 scale over 6-8-bit sub-block scales.

Each expression keeps ggml's order of float32 operations (scale products first, then code times scale, then the
offset) so the result is bit-identical to gguf-py's numpy reference.
"""

import torch

from strata.quant.fields import fp16_at, planes


def scale_min_k4(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """12 bytes -> eight 6-bit sub-block scales and eight 6-bit mins (Q4_K, Q5_K), each [n, 8].

    Bytes 0-3 hold scales 0-3 in their low 6 bits, 4-7 the mins 0-3; scales and mins 4-7 keep their low nibble in
    bytes 8-11 (scale low, min high) and their top 2 bits in the spare top bits of bytes 0-3 and 4-7.
    """
    lo_sc, lo_m, rest = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat([lo_sc & 63, (rest & 15) | ((lo_sc >> 2) & 48)], dim=-1)
    m = torch.cat([lo_m & 63, (rest >> 4) | ((lo_m >> 2) & 48)], dim=-1)
    return sc, m


def q2_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    scales, qs = blocks[:, 0:16], blocks[:, 16:80]
    dl = (fp16_at(blocks, 80) * (scales & 15).float()).view(n, 16, 1)
    ml = (fp16_at(blocks, 82) * (scales >> 4).float()).view(n, 16, 1)
    q = planes(qs.reshape(n, 2, 32), 2).reshape(n, 16, 16).float()
    return (dl * q - ml).view(n, 256)


def q3_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    hmask, qs, scales = blocks[:, 0:32], blocks[:, 32:96], blocks[:, 96:108]
    low = planes(scales[:, 0:8], 4).reshape(n, 16)
    high = planes(scales[:, 8:12], 2).reshape(n, 16)
    sc = ((low | (high << 4)).int() - 32).float()
    dl = (fp16_at(blocks, 108) * sc).view(n, 16, 1)
    ql = planes(qs.reshape(n, 2, 32), 2).reshape(n, 16, 16).int()
    hbit = planes(hmask.reshape(n, 1, 32), 1).reshape(n, 16, 16).int()
    # A clear high bit subtracts 4: codes run -4..3.
    q = (ql - 4 * (1 - hbit)).float()
    return (dl * q).view(n, 256)


def q4_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    sc, m = scale_min_k4(blocks[:, 4:16])
    d = (fp16_at(blocks, 0) * sc.float()).view(n, 8, 1)
    dm = (fp16_at(blocks, 2) * m.float()).view(n, 8, 1)
    q = planes(blocks[:, 16:144].reshape(n, 4, 32), 4).reshape(n, 8, 32).float()
    return (d * q - dm).view(n, 256)


def q5_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    sc, m = scale_min_k4(blocks[:, 4:16])
    d = (fp16_at(blocks, 0) * sc.float()).view(n, 8, 1)
    dm = (fp16_at(blocks, 2) * m.float()).view(n, 8, 1)
    ql = planes(blocks[:, 48:176].reshape(n, 4, 32), 4).reshape(n, 8, 32)
    qh = planes(blocks[:, 16:48].reshape(n, 1, 32), 1).reshape(n, 8, 32)
    q = (ql | (qh << 4)).float()
    return (d * q - dm).view(n, 256)


def q6_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    scales = blocks[:, 192:208].view(torch.int8).float()
    d = (fp16_at(blocks, 208) * scales).view(n, 16, 1)
    ql = planes(blocks[:, 0:128].reshape(n, 2, 64), 4).reshape(n, 8, 32)
    qh = planes(blocks[:, 128:192].reshape(n, 2, 32), 2).reshape(n, 8, 32)
    q = ((ql | (qh << 4)).int() - 32).float().view(n, 16, 16)
    return (d * q).view(n, 256)
