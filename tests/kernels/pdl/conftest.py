"""Compiled kernels on a GPU, the same kernels under Triton's interpreter elsewhere."""

import os

import torch

if not torch.cuda.is_available():
    # Must precede the first import of a kernel module: @triton.jit picks the interpreter when it decorates.
    os.environ.setdefault("TRITON_INTERPRET", "1")
