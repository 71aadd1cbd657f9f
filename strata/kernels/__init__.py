"""Triton kernels, each beside its torch reference, a folder a concern: attention/, gdn/, hc/, moe/, pointwise/,
quant/, sample/ (a sampled token's draw), select/ (QSA); each folder's own note says what it holds.

Without a GPU, Triton's interpreter is switched on before Triton is first imported, so that the CPU tests run the
kernels' own code; dispatchers still take the torch references for CPU tensors.
"""

from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available() and "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # kernels choose their interpreter forms by this

if INTERPRETED:
    from triton.runtime import interpreter as _interpreter

    def _patch_lang_tensor(tensor, scope, _original=_interpreter._patch_lang_tensor):
        """Triton 3.6's interpreter holds scalars as 1-element arrays, which numpy >= 2.4 no longer turns into an
        int: loops with runtime bounds (`range(0, n, TILE)`) need the scalar read as an element."""
        _original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    _interpreter._patch_lang_tensor = _patch_lang_tensor


def capability(t: torch.Tensor) -> tuple[int, int]:
    """The GPU generation a tensor lives on; the interpreter counts as the newest (it runs every kernel)."""
    return torch.cuda.get_device_capability(t.device) if t.is_cuda else (9, 0)
