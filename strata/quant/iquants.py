"""The i-quants (IQ1_S .. IQ4_XS): codes index a lattice grid or a non-linear level table.

Each expression keeps gguf-py's order of float32 operations so the result is bit-identical to its numpy reference.
"""

import torch

from strata.quant.fields import bit_fields, fp16_at, interleaved, planes, u16, u32
from strata.quant.tables import lookup

_DELTA = 0.125  # IQ1's shift of every grid point, its sign chosen per group
_SIGN_INDICES = (0, 7, 14, 21)  # four 7-bit sign-pattern indices in a uint32


def _sign_bits(b: torch.Tensor) -> torch.Tensor:
    """Explicit sign bits, one per weight (bit k of byte i -> weight 8i+k), as ±1 float32 [n, 8 * bytes]."""
    return 1 - 2 * interleaved(b, 1).float()


def iq2_xxs(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    # 8 groups of 32 weights, each 8 bytes: 4 grid indices, then a uint32 of 4x7 sign indices and a 4-bit scale.
    groups = blocks[:, 2:66].reshape(n, 8, 8)
    aux = u32(groups[:, :, 4:8]).view(n, 8)
    db = (fp16_at(blocks, 0) * (0.5 + (aux >> 28).float()) * 0.25).view(n, 8, 1, 1)
    signs = lookup("signs", bit_fields(aux, _SIGN_INDICES, 7))
    grid = lookup("iq2_xxs", groups[:, :, 0:4])
    return (db * grid * signs).view(n, 256)


def iq2_xs(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    # 32 uint16 codes: 9-bit grid index, 7-bit sign index; 16 4-bit scales, one per 16 weights.
    qs = u16(blocks[:, 2:66])
    scales = interleaved(blocks[:, 66:74], 4).float()
    db = (fp16_at(blocks, 0) * (0.5 + scales) * 0.25).view(n, 16, 1, 1)
    signs = lookup("signs", qs >> 9).view(n, 16, 2, 8)
    grid = lookup("iq2_xs", qs & 511).view(n, 16, 2, 8)
    return (db * grid * signs).view(n, 256)


def iq2_s(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    qs, signs, qh, scales = blocks[:, 2:34], blocks[:, 34:66], blocks[:, 66:74], blocks[:, 74:82]
    db = (fp16_at(blocks, 0) * (0.5 + interleaved(scales, 4).float()) * 0.25).view(n, 16, 1, 1)
    index = qs.int() | (interleaved(qh, 2).int() << 8)
    grid = lookup("iq2_s", index).view(n, 16, 2, 8)
    return (db * grid * _sign_bits(signs).view(n, 16, 2, 8)).view(n, 256)


def iq3_xxs(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    # 64 grid indices (4 weights each), then per 32 weights a uint32 of 4x7 sign indices and a 4-bit scale.
    qs, aux = blocks[:, 2:66], u32(blocks[:, 66:98])
    db = (fp16_at(blocks, 0) * (0.5 + (aux >> 28).float()) * 0.5).view(n, 8, 1, 1)
    signs = lookup("signs", bit_fields(aux, _SIGN_INDICES, 7))
    grid = lookup("iq3_xxs", qs).view(n, 8, 4, 8)
    return (db * grid * signs).view(n, 256)


def iq3_s(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    qs, qh, signs, scales = blocks[:, 2:66], blocks[:, 66:74], blocks[:, 74:106], blocks[:, 106:110]
    db = (fp16_at(blocks, 0) * (1 + 2 * interleaved(scales, 4).float())).view(n, 8, 1, 1)
    index = qs.int() | (interleaved(qh, 1).int() << 8)
    grid = lookup("iq3_s", index).view(n, 8, 4, 8)
    return (db * grid * _sign_bits(signs).view(n, 8, 4, 8)).view(n, 256)


def iq1_s(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    # Per 32 weights a uint16: 4x3 high index bits, a 3-bit scale, and the sign of the shift.
    qs, qh = blocks[:, 2:34], u16(blocks[:, 34:50])
    dl = (fp16_at(blocks, 0) * (2 * ((qh >> 12) & 7) + 1).float()).view(n, 8, 1, 1)
    delta = torch.where((qh & 0x8000) == 0, _DELTA, -_DELTA).view(n, 8, 1, 1)
    index = qs.int() | (bit_fields(qh, (0, 3, 6, 9), 3).view(n, 32) << 8)
    grid = lookup("iq1_s", index).view(n, 8, 4, 8)
    return (dl * (grid + delta)).view(n, 256)


def iq1_m(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    qs, qh, words = blocks[:, 0:32], blocks[:, 32:48], u16(blocks[:, 48:56])
    # The fp16 super-scale is spread over the top nibbles of the four scale words, lowest nibble first.
    d_bits = sum((words[:, i : i + 1] >> 12) << (4 * i) for i in range(4))
    d_bits = d_bits - ((d_bits >> 15) << 16)  # as a signed int16, so the cast below keeps the bits
    d = d_bits.to(torch.int16).view(torch.float16).float()
    dl = (d * (2 * bit_fields(words, (0, 3, 6, 9), 3).view(n, 16) + 1).float()).view(n, 8, 2, 1, 1)
    nibbles = interleaved(qh, 4)
    index = qs.int() | ((nibbles & 7).int() << 8)
    delta = torch.where((nibbles & 8) == 0, _DELTA, -_DELTA).view(n, 8, 2, 2, 1)
    grid = lookup("iq1_s", index).view(n, 8, 2, 2, 8)
    return (dl * (grid + delta)).view(n, 256)


def iq4_nl(blocks: torch.Tensor) -> torch.Tensor:
    return fp16_at(blocks, 0) * lookup("iq4_nl", planes(blocks[:, 2:18], 4).flatten(-2))


def iq4_xs(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    # Eight 6-bit scales: low nibbles in bytes 4-7, top 2 bits in the uint16 at byte 2.
    low = interleaved(blocks[:, 4:8], 4).int()
    high = bit_fields(u16(blocks[:, 2:4]), range(0, 16, 2), 2).view(n, 8)
    dl = (fp16_at(blocks, 0) * ((low | (high << 4)) - 32).float()).view(n, 8, 1)
    q = planes(blocks[:, 8:136].reshape(n, 8, 16), 4).reshape(n, 8, 32)
    return (dl * lookup("iq4_nl", q)).view(n, 256)
