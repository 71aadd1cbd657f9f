"""Reading GGML block fields out of raw bytes with torch: fp16 scalars, little-endian words, packed bit planes."""

import torch


def view_as(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Reinterpret the bytes of b [..., k * itemsize] as dtype [..., k], copying only when layout forbids a view."""
    flat = b.reshape(-1)
    if flat.storage_offset() % dtype.itemsize:  # a wider view must start on its own alignment
        flat = flat.clone()
    return flat.view(dtype).view(*b.shape[:-1], -1)


def fp16_at(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 at byte `start` of each block of a [n, type_size] byte tensor, as float32 [n, 1]."""
    return view_as(blocks[:, start : start + 2], torch.float16).float()


def u16(b: torch.Tensor) -> torch.Tensor:
    """Little-endian uint16 words of a [..., 2k] byte tensor, as int32 [..., k]."""
    # torch's unsigned 16/32-bit types lack shifts on some devices, so words live in wider signed ints.
    return view_as(b, torch.int16).int() & 0xFFFF


def u32(b: torch.Tensor) -> torch.Tensor:
    """Little-endian uint32 words of a [..., 4k] byte tensor, as int64 [..., k]."""
    return view_as(b, torch.int32).long() & 0xFFFFFFFF


def planes(b: torch.Tensor, bits: int) -> torch.Tensor:
    """[..., g] bytes -> [..., 8 // bits, g] codes: plane p holds bits [p*bits, (p+1)*bits) of every byte.

    This is ggml's usual packing: a byte carries one code from each of 8 // bits runs of g weights. See
    `interleaved` for the other, where a byte carries consecutive weights.
    """
    # One scalar shift per plane: on CPU a broadcast shift tensor is ~50x slower.
    return torch.stack([(b >> shift) & ((1 << bits) - 1) for shift in range(0, 8, bits)], dim=-2)


def interleaved(b: torch.Tensor, bits: int) -> torch.Tensor:
    """[..., g] bytes -> [..., g * 8 // bits] codes, byte i carrying codes i*k .. i*k+k-1 from its low bits up."""
    return planes(b.unsqueeze(-1), bits).flatten(-3)


def bit_fields(words: torch.Tensor, starts: range | tuple[int, ...], width: int) -> torch.Tensor:
    """Integer words [...] -> [..., len(starts)]: the `width`-bit field at each start bit."""
    return torch.stack([(words >> start) & ((1 << width) - 1) for start in starts], dim=-1)
