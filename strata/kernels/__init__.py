"""Triton kernels, each beside its torch reference: attention/ (int8 KV, prompt and decode attention), select/ (QSA).

Without a GPU, Triton's interpreter is switched on before Triton is first imported, so that the CPU tests run the
kernels' own code; dispatchers still take the torch references for CPU tensors.
"""

from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available() and "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def capability(t: torch.Tensor) -> tuple[int, int]:
    """The GPU generation a tensor lives on; the interpreter counts as the newest (it runs every kernel)."""
    return torch.cuda.get_device_capability(t.device) if t.is_cuda else (9, 0)
