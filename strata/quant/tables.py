"""Lookup tables of the quant formats (IQ grids, sign patterns, non-linear levels) as torch tensors, per device.

The IQ lattice grids and IQ4_NL's levels are read at run time from the installed gguf package (which carries them
for its numpy reference), so the two can never disagree and no large literal table lives here.
"""

import functools

import gguf.quants
import numpy as np
import torch

_GRID_OWNERS = {
    "iq2_xxs": gguf.quants.IQ2_XXS,
    "iq2_xs": gguf.quants.IQ2_XS,
    "iq2_s": gguf.quants.IQ2_S,
    "iq3_xxs": gguf.quants.IQ3_XXS,
    "iq3_s": gguf.quants.IQ3_S,
    "iq1_s": gguf.quants.IQ1_S,
}


def grid_values(name: str) -> np.ndarray:
    """The lattice of one IQ format as float32 [entries, 4 or 8]."""
    owner = _GRID_OWNERS[name]
    owner.init_grid()
    return np.asarray(owner.grid, dtype=np.float32).reshape(owner.grid_shape)


def sign_patterns() -> np.ndarray:
    """±1 float32 [128, 8]: 7 stored sign bits plus an 8th that makes the count of minus signs even."""
    index = np.arange(128)
    parity = np.array([bin(i).count("1") & 1 for i in index])
    byte = index | (parity << 7)
    bits = (byte[:, None] >> np.arange(8)) & 1
    return (1 - 2 * bits).astype(np.float32)


def iq4_nl_levels() -> np.ndarray:
    """The 16 non-linear levels of IQ4_NL and IQ4_XS, float32."""
    return np.array(gguf.quants.IQ4_NL.kvalues, dtype=np.float32)


def mxfp4_levels() -> np.ndarray:
    """MXFP4's 16 e2m1 codes doubled to integers (magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6), the top bit the sign."""
    magnitudes = np.array([0, 1, 2, 3, 4, 6, 8, 12], dtype=np.float32)
    return np.concatenate([magnitudes, 0 - magnitudes])  # 0 - x: the negative zero code reads as +0, as in ggml


@functools.cache
def table(name: str, device: torch.device) -> torch.Tensor:
    """A grid ("iq2_xxs", ...), "signs", "iq4_nl" or "mxfp4" as a float32 tensor on `device`, cached."""
    builders = {"signs": sign_patterns, "iq4_nl": iq4_nl_levels, "mxfp4": mxfp4_levels}
    values = builders[name]() if name in builders else grid_values(name)
    return torch.from_numpy(values).to(device)


def lookup(name: str, index: torch.Tensor) -> torch.Tensor:
    """Rows of table `name` at integer `index` (any shape) -> [*index.shape, *row_shape]."""
    values = table(name, index.device)
    # index_select is several times faster on CPU than advanced indexing.
    return values.index_select(0, index.reshape(-1).long()).view(*index.shape, *values.shape[1:])
